"""Constraints a gen can carry, rendered as what the runtime understands: a regex or a JSON schema.

`choices` become an alternation of escaped strings; `dtype` a regex per Python type plus a parser
that turns the matched text back into that type; `json_schema` (a dict, a JSON string or a pydantic
model class) a JSON string. Regexes use the syntax common to Python `re` and Rust `regex`. This is
the one source of these constants: the runtime's constraint specs import them from here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

REGEX_INT = r"-?(0|[1-9][0-9]*)"
REGEX_FLOAT = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?"
REGEX_BOOL = r"(True|False)"
# A JSON string literal: no raw control characters, only JSON escapes.
REGEX_STR = r'"([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"'

DTYPE_REGEX: dict[type, str] = {
    int: REGEX_INT,
    float: REGEX_FLOAT,
    bool: REGEX_BOOL,
    str: REGEX_STR,
}


def choices_regex(choices: Sequence[str]) -> str:
    """A regex matching exactly one of `choices`."""
    if isinstance(choices, str) or not isinstance(choices, Sequence):
        raise TypeError(f"choices must be a list of str, got {choices!r}")
    if not choices:
        raise ValueError("choices must not be empty")
    for choice in choices:
        if not isinstance(choice, str):
            raise TypeError(f"every choice must be a str, got {choice!r}")
    # re.escape only escapes ASCII punctuation and whitespace, which Rust's regex accepts too.
    return "(" + "|".join(re.escape(c) for c in choices) + ")"


def dtype_regex(dtype: Any) -> str:
    """The regex a gen with `dtype` is constrained to."""
    if dtype not in DTYPE_REGEX:
        raise ValueError(f"dtype must be one of int, float, bool, str; got {dtype!r}")
    return DTYPE_REGEX[dtype]


def parse_value(text: str, dtype: type | None) -> Any:
    """The captured value of a gen: `text` itself, or parsed to `dtype`.

    A str gen keeps its text as generated, quotes included, as SGLang's does: the text may be
    cut by max_tokens or a stop string, and it is what a JSON template around it needs.
    """
    if dtype is None or dtype is str:
        return text
    try:
        if dtype is bool:
            if text not in ("True", "False"):
                raise ValueError(text)
            return text == "True"
        return dtype(text)
    except ValueError as err:
        raise ValueError(f"generated text {text!r} is not a valid {dtype.__name__}") from err


def schema_to_json(schema: Any) -> str:
    """A JSON schema given as a dict, a JSON string or a pydantic model class, as JSON text."""
    if isinstance(schema, str):
        try:
            parsed = json.loads(schema)
        except json.JSONDecodeError as err:
            raise ValueError(f"json_schema is not valid JSON: {err}") from err
        if not isinstance(parsed, dict):
            raise ValueError(f"json_schema must be a JSON object, got {schema[:80]!r}")
        return schema
    if isinstance(schema, dict):
        return json.dumps(schema, ensure_ascii=False)
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return json.dumps(schema.model_json_schema(), ensure_ascii=False)
    raise TypeError(f"json_schema must be a dict, JSON string or pydantic model, got {schema!r}")


def schema_to_regex(schema: Any, whitespace_pattern: str | None = None) -> str:
    """The regex outlines-core derives from a JSON schema (for backends that only take a regex)."""
    from outlines_core.json_schema import build_regex_from_schema

    regex: str = build_regex_from_schema(schema_to_json(schema), whitespace_pattern)
    return regex
