"""The expressions a program appends to its state: text, gen, select, roles, variable scopes.

Expressions are inert values; `s += expr` hands them to the interpreter. `a + b` of an expression
and a str (or two expressions) is an ExprList, so `"Answer: " + gen("x")` works as in SGLang.
The constructors here validate user input at the boundary and name the bad value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .choices import ChoicesSamplingMethod, token_length_normalized
from .constraints import dtype_regex, schema_to_json
from .sampling import SamplingParams
from .sampling_table import check_param


class Expr:
    """Base of everything `s += ...` accepts besides str."""

    __slots__ = ()

    def __add__(self, other: Expr | str) -> ExprList:
        return ExprList([self, to_expr(other)])

    def __radd__(self, other: Expr | str) -> ExprList:
        return ExprList([to_expr(other), self])


@dataclass(slots=True, eq=False)
class Constant(Expr):
    text: str


@dataclass(slots=True, eq=False)
class Gen(Expr):
    name: str | None
    params: SamplingParams
    dtype: type | None = None


@dataclass(slots=True, eq=False)
class Select(Expr):
    name: str | None
    choices: list[str]
    method: ChoicesSamplingMethod
    temperature: float = 0.0


@dataclass(slots=True, eq=False)
class RoleBegin(Expr):
    role: str


@dataclass(slots=True, eq=False)
class RoleEnd(Expr):
    role: str


@dataclass(slots=True, eq=False)
class VarScopeBegin(Expr):
    name: str


@dataclass(slots=True, eq=False)
class VarScopeEnd(Expr):
    name: str


@dataclass(slots=True, eq=False)
class ExprList(Expr):
    exprs: list[Expr] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class ProgramCall(Expr):
    """`other_program(args)` written inside a program: its body runs inline on the caller's `s`."""

    program: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(slots=True, eq=False)
class CachePrefix(Expr):
    """Prefill the state's text on the runtime (a `max_new_tokens: 0` request) before a fork."""


@dataclass(slots=True, eq=False)
class ConcatAndAppend(Expr):
    """Append each fork branch's own text (what it added after the fork) to the parent."""

    branches: list[Any]


def to_expr(value: Any) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return Constant(value)
    raise TypeError(
        f"cannot append {type(value).__name__} {value!r} to a program state; "
        "append a str, gen(...), select(...), a role, or a program call"
    )


def flatten(value: Any) -> list[Expr]:
    """`value` as a flat list of primitive expressions, in order."""
    expr = to_expr(value)
    if not isinstance(expr, ExprList):
        return [expr]
    return [leaf for child in expr.exprs for leaf in flatten(child)]


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    stop: str | Sequence[str] | None = None,
    stop_token_ids: Sequence[int] | None = None,
    stop_regex: str | Sequence[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    regex: str | None = None,
    json_schema: Any = None,
    choices: Sequence[str] | None = None,
    dtype: type | str | None = None,
    ebnf: str | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    n: int | None = None,
    choices_method: ChoicesSamplingMethod | None = None,
    repetition_penalty: float | None = None,
    seed: int | None = None,
) -> Gen | Select:
    """Generate text and capture it as `name` (a list of n texts when n > 1).

    At most one constraint: `regex`, `json_schema` (dict, JSON string or pydantic model class),
    `choices`, `dtype` or `ebnf` (a GBNF grammar, SGLang's field; Lark also parses). With
    `choices` this is `select(name, choices, temperature, choices_method)`, as in SGLang: each
    choice is scored, none generated. `repetition_penalty` and `seed` go past SGLang's gen: the
    runtime's fields of the same names. `dtype` int, float or
    bool (or their names) captures the value parsed to that type; str captures the generated
    quoted string as its raw text, quotes included (SGLang's behaviour). Unset options take the
    program-level defaults.
    """
    _check_name(name)
    if choices is not None:
        given = {"regex": regex, "json_schema": json_schema, "dtype": dtype, "ebnf": ebnf}
        named = [key for key, value in given.items() if value is not None]
        if named:
            raise ValueError(f"gen takes at most one of {_CONSTRAINTS}, got {named}")
        method = token_length_normalized if choices_method is None else choices_method
        return select(name, choices, temperature or 0.0, method)
    if choices_method is not None:
        raise ValueError("gen's choices_method needs choices")
    dtype = _DTYPE_NAMES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    params = SamplingParams(
        max_new_tokens=max_tokens,
        min_new_tokens=min_tokens,
        stop=_stop_strings(stop),
        stop_token_ids=None if stop_token_ids is None else list(stop_token_ids),
        stop_regex=_stop_strings(stop_regex),
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        repetition_penalty=repetition_penalty,
        ignore_eos=ignore_eos,
        n=n,
        seed=seed,
        regex=_constraint_regex(regex, json_schema, dtype, ebnf),
        json_schema=None if json_schema is None else schema_to_json(json_schema),
        ebnf=ebnf,
        return_logprob=return_logprob,
        logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num,
        return_text_in_logprobs=return_text_in_logprobs,
    )
    return Gen(name=name, params=params, dtype=dtype)


# SGLang also names the dtypes as strings.
_DTYPE_NAMES: dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str}


def gen_int(name: str | None = None, **kwargs: Any) -> Gen:
    """gen(..., dtype=int): the captured value is an int."""
    return gen(name, dtype=int, **kwargs)


def gen_string(name: str | None = None, **kwargs: Any) -> Gen:
    """gen(..., dtype=str): a quoted string, captured as generated (quotes included)."""
    return gen(name, dtype=str, **kwargs)


def select(
    name: str | None = None,
    choices: Sequence[str] | None = None,
    temperature: float = 0.0,
    choices_method: ChoicesSamplingMethod = token_length_normalized,
) -> Select:
    """Append the choice the model scores highest, capturing it as `name`.

    Each choice is scored by the logprobs of exactly its own tokens after the prefix.
    `temperature` is SGLang's argument: 0 picks the choices method's decision; above 0 the
    choice is sampled from the softmax of the normalized logprobs over the temperature.
    """
    _check_name(name)
    if choices is None or isinstance(choices, str) or not isinstance(choices, Sequence):
        raise TypeError(f"select needs choices as a list of str, got {choices!r}")
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise ValueError(f"select needs choices as a non-empty list of non-empty str: {choices!r}")
    if not isinstance(choices_method, ChoicesSamplingMethod):
        raise TypeError(f"choices_method must be a ChoicesSamplingMethod, got {choices_method!r}")
    # The runtime's temperature rule (lang/sampling_table.py), though select applies it here.
    return Select(name, list(choices), choices_method, check_param("temperature", temperature))


_CONSTRAINTS = "regex/json_schema/choices/dtype/ebnf"


def _constraint_regex(regex: str | None, json_schema: Any, dtype: Any, ebnf: Any) -> str | None:
    """The regex the constraint implies (a schema or grammar travels as itself); at most one."""
    given = {"regex": regex, "json_schema": json_schema, "dtype": dtype, "ebnf": ebnf}
    named = [key for key, value in given.items() if value is not None]
    if len(named) > 1:
        raise ValueError(f"gen takes at most one of {_CONSTRAINTS}, got {named}")
    if dtype is not None:
        return dtype_regex(dtype)
    return regex


def _stop_strings(stop: Any) -> Any:
    """Stop strings given as a tuple, as the list the wire takes; anything else as given."""
    return list(stop) if isinstance(stop, list | tuple) else stop


def _check_name(name: Any) -> None:
    if name is not None and (not isinstance(name, str) or not name):
        raise TypeError(f"a variable name must be a non-empty str, got {name!r}")


def role_expr(role: str, expr: Expr | str | None) -> ExprList:
    """[begin, expr, end] of `role` (just [begin, end] without `expr`)."""
    inner = [] if expr is None else [to_expr(expr)]
    return ExprList([RoleBegin(role), *inner, RoleEnd(role)])


def system(expr: Expr | str | None = None) -> ExprList:
    """A system message around `expr`."""
    return role_expr("system", expr)


def user(expr: Expr | str | None = None) -> ExprList:
    """A user message around `expr`."""
    return role_expr("user", expr)


def assistant(expr: Expr | str | None = None) -> ExprList:
    """An assistant message around `expr`.

    A gen inside stops where the template ends the turn: the assistant suffix's stripped text
    (e.g. "<|im_end|>") is added to its stop strings, and the model's EOS ends it as well (for
    ChatML models they are the same token, which the runtime may drop from the text).
    """
    return role_expr("assistant", expr)


def system_begin() -> RoleBegin:
    return RoleBegin("system")


def system_end() -> RoleEnd:
    return RoleEnd("system")


def user_begin() -> RoleBegin:
    return RoleBegin("user")


def user_end() -> RoleEnd:
    return RoleEnd("user")


def assistant_begin() -> RoleBegin:
    return RoleBegin("assistant")


def assistant_end() -> RoleEnd:
    return RoleEnd("assistant")
