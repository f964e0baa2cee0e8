"""Bounds on one /generate request, checked on its raw dict before any work is spent on it.

Every bound is an EngineConfig field (a `stemma serve` flag): prompts x n, characters of a
text prompt, top_logprobs_num, the count and length of stop strings and stop regexes, and
the size of a regex / json_schema / ebnf constraint, and a json_schema's nesting depth and
estimated regex size (constrained/schema_size.py). The checks here only count: they run
before tokenizing, compiling a stop regex, or reading a schema, and cost time linear in the
request's size (which the server's body limit bounds). Both the engine's parser
(io_struct.py) and the HTTP server (before it tokenizes or checks constraints) call them.
"""

from __future__ import annotations

import json
from typing import Any

from .config import EngineConfig
from .constrained.schema_size import (
    MAX_COUNT,
    estimated_regex_chars,
    json_depth,
    oversized_count,
)

CONSTRAINT_FIELDS = ("regex", "json_schema", "ebnf", "structural_tag")


def check_bounds(d: dict[str, Any], limits: EngineConfig) -> None:
    """ValueError naming the value, the limit and its flag for a request over a bound.
    Malformed values are left to the parser, which names them."""
    prompts = _prompt_list(d.get("text"), d.get("input_ids"))
    _at_most(limits, "max_request_items", len(prompts), "the request has {} prompts")
    longest = max((len(p) for p in prompts if isinstance(p, str)), default=0)
    _at_most(limits, "max_prompt_chars", longest, "a text prompt has {} characters")
    raw = d.get("sampling_params")
    params = raw if isinstance(raw, list) else [raw] * max(len(prompts), 1)
    num_items = sum(_count(p.get("n") if isinstance(p, dict) else None) for p in params)
    what = "the request asks for {} generations (prompts x n)"
    _at_most(limits, "max_request_items", num_items, what)
    for p in {id(p): p for p in params if isinstance(p, dict)}.values():
        check_sampling_bounds(p, limits)
    top = d.get("top_logprobs_num")
    most = max((t for t in (top if isinstance(top, list) else [top]) if _is_int(t)), default=0)
    _at_most(limits, "max_top_logprobs", most, "top_logprobs_num is {}")


def check_sampling_bounds(sp: dict[str, Any], limits: EngineConfig, prefix: str = "") -> None:
    """The bounds of one raw sampling_params dict (or an OpenAI body, with `prefix` "")."""
    stops = [s for key in ("stop", "stop_regex") for s in _str_list(sp.get(key))]
    _at_most(limits, "max_stop_strings", len(stops), "{} stop strings and regexes")
    longest = max((len(s) for s in stops), default=0)
    _at_most(limits, "max_stop_chars", longest, "a stop string or regex has {} characters")
    schema = sp.get("json_schema")
    backend = sp.get("grammar_backend") or limits.grammar_backend
    if isinstance(schema, (dict, list)):  # depth first: measuring its size recurses
        check_schema_bounds(schema, limits, f"{prefix}json_schema", backend)
    for key in CONSTRAINT_FIELDS:
        size = constraint_size(sp.get(key), f"{prefix}{key}")
        _at_most(limits, "max_constraint_chars", size, f"{prefix}{key} has {{}} characters")
    if isinstance(schema, str):
        check_schema_bounds(schema, limits, f"{prefix}json_schema", backend)


def check_schema_bounds(
    schema: Any, limits: EngineConfig, name: str, backend: Any = "outlines"
) -> None:
    """A schema (dict or JSON text) nested deeper than max_schema_depth, or, for the outlines
    backend, whose regex would exceed max_schema_regex_chars by estimate, is refused before
    the backend reads it (llguidance builds no regex: its own fuel and size limits bound it).
    Text that is not JSON is left to the parser."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except RecursionError:
            raise ValueError(
                f"{name} is nested deeper than Python's JSON parser allows; the limit is "
                f"{limits.max_schema_depth} (--max-schema-depth)"
            ) from None
        except ValueError:
            return
    _at_most(limits, "max_schema_depth", json_depth(schema), f"{name} is nested {{}} deep")
    if (count := oversized_count(schema)) is not None:
        raise ValueError(
            f"{name}: {count[0]} is {count[1]}; a count must be below {MAX_COUNT} (2^32), the "
            "most repetitions a regex holds"
        )
    if backend != "outlines":
        return
    try:
        size = estimated_regex_chars(schema)
    except RecursionError:
        raise ValueError(
            f"{name} is nested too deeply to estimate; lower the limit of "
            f"{limits.max_schema_depth} (--max-schema-depth)"
        ) from None
    what = f"{name} would build a regex of about {{}} characters (an upper estimate)"
    _at_most(limits, "max_schema_regex_chars", size, what)


def constraint_size(value: Any, name: str) -> int:
    """Characters of a constraint given as text, or of an object as compact JSON."""
    if isinstance(value, str):
        return len(value)
    if not isinstance(value, (dict, list)):
        return 0
    try:
        return len(json.dumps(value, separators=(",", ":")))
    except RecursionError:
        raise ValueError(f"{name} is nested too deeply") from None


def _at_most(limits: EngineConfig, field: str, value: int, what: str) -> None:
    limit = getattr(limits, field)
    if value > limit:
        flag = "--" + field.replace("_", "-")
        raise ValueError(f"{what.format(value)}; the limit is {limit} ({flag})")


def _prompt_list(text: Any, ids: Any) -> list[Any]:
    if isinstance(text, list):
        return text
    if text is not None:
        return [text]
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        return ids
    return [] if ids is None else [ids]


def _str_list(value: Any) -> list[str]:
    items = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    return [s for s in items if isinstance(s, str)]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(n: Any) -> int:
    return n if _is_int(n) and n > 0 else 1
