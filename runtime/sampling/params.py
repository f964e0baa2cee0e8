"""SamplingParams: the `sampling_params` of one /generate request, validated and normalized.

Invariant: a constructed SamplingParams is valid (every field has its normalized type and is in
range), so nothing downstream re-checks it. Bad input raises TypeError / ValueError naming the
field, the value and what is allowed; the server turns them into HTTP 400s.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

# The grammar constraints; a request may set at most one.
GRAMMAR_FIELDS = ("regex", "json_schema", "ebnf", "structural_tag")
# SGLang's newer name for `seed`; from_dict folds it into `seed`.
_ALIASES = {"sampling_seed": "seed"}
_MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed accepts [0, 2**64)
_MAX_LOGIT_BIAS = 100.0

_INT_FIELDS = ("max_new_tokens", "min_new_tokens", "top_k", "n")
_FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
)
_BOOL_FIELDS = (
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
)
# field -> (predicate, what is allowed); checked after the type checks.
_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "max_new_tokens": (lambda v: v >= 0, ">= 0 (0 = prefill only)"),
    "min_new_tokens": (lambda v: v >= 0, ">= 0"),
    "top_k": (lambda v: v >= -1, "-1 or 0 (off) or >= 1"),
    "n": (lambda v: v >= 1, ">= 1"),
    "temperature": (lambda v: v >= 0.0, ">= 0 (0 = greedy)"),
    "top_p": (lambda v: 0.0 < v <= 1.0, "in (0, 1]"),
    "min_p": (lambda v: 0.0 <= v <= 1.0, "in [0, 1]"),
    "frequency_penalty": (lambda v: -2.0 <= v <= 2.0, "in [-2, 2]"),
    "presence_penalty": (lambda v: -2.0 <= v <= 2.0, "in [-2, 2]"),
    "repetition_penalty": (lambda v: 0.0 < v <= 2.0, "in (0, 2] (1 = off)"),
}


def _type_error(name: str, value: object, allowed: str) -> TypeError:
    return TypeError(
        f"sampling_params.{name} must be {allowed}, got {type(value).__name__} {value!r}"
    )


def _value_error(name: str, value: object, allowed: str) -> ValueError:
    return ValueError(f"sampling_params.{name} must be {allowed}, got {value!r}")


def _as_int(name: str, value: object) -> int:
    # bool is an int subclass, but `true` for a count is a client bug, not a 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(name, value, "an integer")
    return value


def _as_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _type_error(name, value, "a number")
    if not math.isfinite(value):
        raise _value_error(name, value, "a finite number")
    return float(value)


def _as_str_list(name: str, value: object) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
        raise _type_error(name, value, "a string or a list of strings")
    if any(s == "" for s in items):
        raise _value_error(name, value, "non-empty strings")
    return list(items)


def _as_token_ids(name: str, value: object) -> list[int]:
    if not isinstance(value, (list, tuple, set, frozenset)):
        raise _type_error(name, value, "a list of token ids")
    ids = [_as_int(name, t) for t in value]
    if any(t < 0 for t in ids):
        raise _value_error(name, value, "token ids >= 0")
    return sorted(set(ids))


def _as_logit_bias(value: object) -> dict[int, float]:
    if not isinstance(value, dict):
        raise _type_error("logit_bias", value, "an object {token_id: bias}")
    bias: dict[int, float] = {}
    for key, raw in value.items():
        # JSON object keys are strings; in-process callers may pass ints.
        is_int_key = isinstance(key, int) and not isinstance(key, bool)
        if not is_int_key and not (isinstance(key, str) and key.strip().lstrip("-").isdigit()):
            raise _type_error("logit_bias key", key, "an integer token id")
        token_id = int(key)
        if token_id < 0:
            raise _value_error("logit_bias key", key, "a token id >= 0")
        b = _as_float(f"logit_bias[{key!r}]", raw)
        if not -_MAX_LOGIT_BIAS <= b <= _MAX_LOGIT_BIAS:
            raise _value_error(f"logit_bias[{key!r}]", raw, "in [-100, 100]")
        bias[token_id] = b
    return bias


def _as_json_text(name: str, value: object) -> str | None:
    """A JSON document given as text or as a dict, normalized to text."""
    if value is None:
        return None
    if isinstance(value, dict):
        return json.dumps(value)
    if not isinstance(value, str):
        raise _type_error(name, value, "a JSON string or an object")
    try:
        json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"sampling_params.{name} must be valid JSON, got {value!r}: {e}") from e
    return value


def _compile_all(name: str, patterns: list[str]) -> None:
    for p in patterns:
        try:
            re.compile(p)
        except re.error as e:
            raise ValueError(
                f"sampling_params.{name} must be valid regular expressions, got {p!r}: {e}"
            ) from e


@dataclass(slots=True)
class SamplingParams:
    """SGLang's native sampling parameters; build from JSON with `from_dict`."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0  # EOS and stop_token_ids are masked until this many are generated
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)  # sorted, unique
    stop_regex: list[str] = field(default_factory=list)
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0 = off
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    n: int = 1
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    regex: str | None = None
    json_schema: str | None = None  # a dict is serialized to JSON text
    ebnf: str | None = None
    structural_tag: str | None = None
    custom_params: dict[str, Any] | None = None  # accepted and carried; no meaning in stemma
    stream_interval: int | None = None

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            setattr(self, name, _as_int(name, getattr(self, name)))
        for name in _FLOAT_FIELDS:
            setattr(self, name, _as_float(name, getattr(self, name)))
        for name in _BOOL_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise _type_error(name, getattr(self, name), "true or false")
        for name, (is_ok, allowed) in _RANGES.items():
            if not is_ok(getattr(self, name)):
                raise _value_error(name, getattr(self, name), allowed)
        if self.min_new_tokens > self.max_new_tokens:
            allowed = f"<= max_new_tokens ({self.max_new_tokens})"
            raise _value_error("min_new_tokens", self.min_new_tokens, allowed)
        self._normalize_collections()
        self._check_optionals()

    def _normalize_collections(self) -> None:
        self.stop = _as_str_list("stop", self.stop)
        self.stop_regex = _as_str_list("stop_regex", self.stop_regex)
        _compile_all("stop_regex", self.stop_regex)
        self.stop_token_ids = _as_token_ids("stop_token_ids", self.stop_token_ids)
        self.logit_bias = _as_logit_bias(self.logit_bias)
        self.json_schema = _as_json_text("json_schema", self.json_schema)
        self.structural_tag = _as_json_text("structural_tag", self.structural_tag)
        if self.custom_params is not None:
            if not isinstance(self.custom_params, dict) or not all(
                isinstance(k, str) for k in self.custom_params
            ):
                raise _type_error("custom_params", self.custom_params, "an object or null")
            self.custom_params = dict(self.custom_params)

    def _check_optionals(self) -> None:
        if self.seed is not None and not 0 <= _as_int("seed", self.seed) <= _MAX_SEED:
            raise _value_error("seed", self.seed, f"in [0, {_MAX_SEED}] or null")
        if (
            self.stream_interval is not None
            and _as_int("stream_interval", self.stream_interval) < 1
        ):
            raise _value_error("stream_interval", self.stream_interval, ">= 1 or null")
        for name in ("regex", "ebnf"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise _type_error(name, getattr(self, name), "a string or null")
        grammars = [name for name in GRAMMAR_FIELDS if getattr(self, name) is not None]
        if len(grammars) > 1:
            raise ValueError(
                f"sampling_params sets {' and '.join(grammars)}; at most one of "
                f"{', '.join(GRAMMAR_FIELDS)} may be set"
            )

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> SamplingParams:
        """Parse a JSON `sampling_params` object; null values mean "not set"."""
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise TypeError(f"sampling_params must be an object, got {type(d).__name__} {d!r}")
        kwargs: dict[str, Any] = {}
        for key, value in d.items():
            name = _ALIASES.get(key, key)
            if name not in _FIELD_NAMES:
                known = ", ".join(sorted(_FIELD_NAMES | _ALIASES.keys()))
                raise ValueError(f"unknown sampling_params field {key!r}; known fields: {known}")
            if value is None:
                continue
            if name in kwargs and kwargs[name] != value:
                raise ValueError(
                    f"sampling_params.{key}={value!r} conflicts with {name}={kwargs[name]!r}"
                )
            kwargs[name] = value
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (logit_bias keys stay ints); from_dict(to_dict()) == self."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in out.items():
            if isinstance(value, (list, dict)):
                out[name] = value.copy()
        return out

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def check_vocab(self, vocab_size: int) -> None:
        """Raise ValueError if a token id in stop_token_ids or logit_bias is >= vocab_size."""
        for name, ids in (("stop_token_ids", self.stop_token_ids), ("logit_bias", self.logit_bias)):
            bad = [t for t in ids if t >= vocab_size]
            if bad:
                raise _value_error(name, bad, f"token ids in [0, {vocab_size - 1}]")


_FIELD_NAMES = frozenset(f.name for f in fields(SamplingParams))
