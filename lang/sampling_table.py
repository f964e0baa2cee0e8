"""The one table of sampling parameters: each field's name, type, range and error message.

Both edges check against it: lang's `gen(...)` / `run(...)` (lang/sampling.py) and the
runtime's `/generate` parser (runtime/sampling/params.py, runtime/io_struct.py), so a value
that the runtime would refuse fails where the program names it, with the runtime's own
message. Stdlib only: the runtime imports it, and lang must not import torch.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed accepts [0, 2**64)
MAX_LOGIT_BIAS = 100.0


def type_error(name: str, value: object, allowed: str) -> TypeError:
    return TypeError(f"{name} must be {allowed}, got {type(value).__name__} {value!r}")


def value_error(name: str, value: object, allowed: str) -> ValueError:
    return ValueError(f"{name} must be {allowed}, got {value!r}")


def as_int(name: str, value: object) -> int:
    # bool is an int subclass, but `true` for a count is a client bug, not a 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise type_error(name, value, "an integer")
    return value


def as_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise type_error(name, value, "a number")
    if not math.isfinite(value):
        raise value_error(name, value, "a finite number")
    return float(value)


def as_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise type_error(name, value, "true or false")
    return value


def as_str(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise type_error(name, value, "a string or null")
    return value


def as_str_list(name: str, value: object) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
        raise type_error(name, value, "a string or a list of strings")
    if any(s == "" for s in items):
        raise value_error(name, value, "non-empty strings")
    return list(items)


def as_regex_list(name: str, value: object) -> list[str]:
    patterns = as_str_list(name, value)
    for p in patterns:
        try:
            re.compile(p)
        except (re.error, RecursionError, OverflowError) as e:
            raise ValueError(f"{name} must be valid regular expressions, got {p!r}: {e}") from e
    return patterns


def as_token_ids(name: str, value: object) -> list[int]:
    if not isinstance(value, (list, tuple, set, frozenset)):
        raise type_error(name, value, "a list of token ids")
    ids = [as_int(name, t) for t in value]
    if any(t < 0 for t in ids):
        raise value_error(name, value, "token ids >= 0")
    return sorted(set(ids))


def as_logit_bias(name: str, value: object) -> dict[int, float]:
    if not isinstance(value, dict):
        raise type_error(name, value, "an object {token_id: bias}")
    bias: dict[int, float] = {}
    for key, raw in value.items():
        # JSON object keys are strings; in-process callers may pass ints.
        is_int_key = isinstance(key, int) and not isinstance(key, bool)
        if not is_int_key and not (isinstance(key, str) and key.strip().lstrip("-").isdigit()):
            raise type_error(f"{name} key", key, "an integer token id")
        token_id = int(key)
        if token_id < 0:
            raise value_error(f"{name} key", key, "a token id >= 0")
        b = as_float(f"{name}[{key!r}]", raw)
        if not -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS:
            raise value_error(f"{name}[{key!r}]", raw, "in [-100, 100]")
        bias[token_id] = b
    return bias


def as_json_text(name: str, value: object) -> str:
    """A JSON document given as text or as a dict, normalized to text."""
    if isinstance(value, dict):
        try:
            return json.dumps(value)
        except RecursionError as e:
            raise ValueError(f"{name} is nested too deeply to serialize") from e
    if not isinstance(value, str):
        raise type_error(name, value, "a JSON string or an object")
    try:
        json.loads(value)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{name} must be valid JSON, got {value!r}: {e}") from e
    return value


def as_custom_params(name: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise type_error(name, value, "an object or null")
    return dict(value)


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter: how its value is typed and normalized, and the range it must be in."""

    label: str  # as messages name it: "sampling_params.top_p" or a request-level "top_logprobs_num"
    convert: Callable[[str, object], Any]  # type check + normalization; raises TypeError
    in_range: Callable[[Any], bool] | None = None
    allowed: str = ""  # what in_range allows, for the message

    def check(self, value: object) -> Any:
        """The normalized value, or TypeError / ValueError naming the field and the value."""
        value = self.convert(self.label, value)
        if self.in_range is not None and not self.in_range(value):
            raise value_error(self.label, value, self.allowed)
        return value


def _row(name: str, convert, in_range=None, allowed: str = "") -> tuple[str, Param]:
    return name, Param(f"sampling_params.{name}", convert, in_range, allowed)


# The grammar backends (runtime/constrained/backend.py); EngineConfig checks against it too.
GRAMMAR_BACKENDS = ("outlines", "llguidance")
# An object's keys in the schema's order, or in any order (runtime/constrained/property_order.py).
PROPERTY_ORDERS = ("schema", "any")

# SGLang's native `sampling_params`, in the order of its SamplingParams. None always means
# "not set"; the table checks set values only.
SAMPLING_PARAMS: dict[str, Param] = dict(
    [
        _row("max_new_tokens", as_int, lambda v: v >= 0, ">= 0 (0 = prefill only)"),
        _row("min_new_tokens", as_int, lambda v: v >= 0, ">= 0"),
        _row("stop", as_str_list),
        _row("stop_token_ids", as_token_ids),
        _row("stop_regex", as_regex_list),
        _row("temperature", as_float, lambda v: v >= 0.0, ">= 0 (0 = greedy)"),
        _row("top_p", as_float, lambda v: 0.0 < v <= 1.0, "in (0, 1]"),
        _row("top_k", as_int, lambda v: v >= -1, "-1 or 0 (off) or >= 1"),
        _row("min_p", as_float, lambda v: 0.0 <= v <= 1.0, "in [0, 1]"),
        _row("frequency_penalty", as_float, lambda v: -2.0 <= v <= 2.0, "in [-2, 2]"),
        _row("presence_penalty", as_float, lambda v: -2.0 <= v <= 2.0, "in [-2, 2]"),
        _row("repetition_penalty", as_float, lambda v: 0.0 < v <= 2.0, "in (0, 2] (1 = off)"),
        _row("n", as_int, lambda v: v >= 1, ">= 1"),
        _row("ignore_eos", as_bool),
        _row("skip_special_tokens", as_bool),
        _row("spaces_between_special_tokens", as_bool),
        _row("no_stop_trim", as_bool),
        _row("logit_bias", as_logit_bias),
        _row("seed", as_int, lambda v: 0 <= v <= MAX_SEED, f"in [0, {MAX_SEED}] or null"),
        _row("regex", as_str),
        _row("json_schema", as_json_text),
        _row("ebnf", as_str),
        _row("structural_tag", as_json_text),
        _row("custom_params", as_custom_params),  # carried; no meaning in stemma
        # stemma's: this request's grammar backend; None = the engine's --grammar-backend.
        _row(
            "grammar_backend", as_str, GRAMMAR_BACKENDS.__contains__, "'outlines' or 'llguidance'"
        ),
        # stemma's: a json_schema's object keys in the schema's order or any order
        _row("property_order", as_str, PROPERTY_ORDERS.__contains__, "'schema' or 'any'"),
        _row("stream_interval", as_int, lambda v: v >= 1, ">= 1 or null"),
        # stemma's: end a constrained output valid within max_new_tokens (on for json_schema)
        _row("close_early", as_bool),
    ]
)

# Request-level fields of /generate that a gen also sets (one value per prompt).
REQUEST_PARAMS: dict[str, Param] = {
    "return_logprob": Param("return_logprob", as_bool),
    "logprob_start_len": Param(
        "logprob_start_len", as_int, lambda v: v >= -1, ">= -1 (-1 = output only)"
    ),
    "top_logprobs_num": Param("top_logprobs_num", as_int, lambda v: v >= 0, ">= 0"),
    "return_text_in_logprobs": Param("return_text_in_logprobs", as_bool),
}

# The grammar constraints; a request may set at most one.
GRAMMAR_FIELDS = ("regex", "json_schema", "ebnf", "structural_tag")


def check_param(name: str, value: object) -> Any:
    """`value` checked and normalized by the table's row for `name` (sampling or request)."""
    row = SAMPLING_PARAMS.get(name) or REQUEST_PARAMS[name]
    return row.check(value)


def check_together(values: dict[str, Any]) -> None:
    """The rules that join fields, over the set ones: min <= max new tokens, one grammar."""
    low, high = values.get("min_new_tokens"), values.get("max_new_tokens")
    if low is not None and high is not None and low > high:
        raise value_error("sampling_params.min_new_tokens", low, f"<= max_new_tokens ({high})")
    grammars = [name for name in GRAMMAR_FIELDS if values.get(name) is not None]
    if len(grammars) > 1:
        raise ValueError(
            f"sampling_params sets {' and '.join(grammars)}; at most one of "
            f"{', '.join(GRAMMAR_FIELDS)} may be set"
        )
