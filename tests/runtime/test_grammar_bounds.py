"""The bounds a json_schema meets before outlines-core reads it (schema_size.py, limits.py) and
the linear-time JSON-safety check of string patterns (json_safe.py), each against what
outlines-core itself builds."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from stemma.runtime.config import EngineConfig
from stemma.runtime.constrained.json_safe import UNSAFE, can_match_unsafe
from stemma.runtime.constrained.schema_check import rewrite_formats
from stemma.runtime.constrained.schema_size import (
    estimated_regex_chars,
    json_depth,
    oversized_count,
)
from stemma.runtime.limits import check_sampling_bounds, check_schema_bounds


def nested(depth: int, wrap: str) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        if wrap == "array":
            schema = {"type": "array", "items": schema}
        elif wrap == "object":
            schema = {"type": "object", "properties": {"a": schema, "b": {"type": "integer"}}}
        else:
            schema = {"anyOf": [schema, {"type": "null"}]}
    return schema


def built_len(schema: dict[str, Any], whitespace: str | None = None) -> int:
    from outlines_core.json_schema import build_regex_from_schema

    return len(build_regex_from_schema(json.dumps(rewrite_formats(schema)), whitespace or ""))


@pytest.mark.parametrize("whitespace", [None, r"[ ]?"])
def test_estimate_bounds_the_built_regex_of_every_corpus_schema(schema_corpus, whitespace):
    for schema in schema_corpus:
        actual = built_len(schema, whitespace)
        # above what is built, and close enough that no ordinary schema is refused
        assert actual <= estimated_regex_chars(schema, whitespace) <= 10 * actual


@pytest.mark.parametrize("wrap", ["array", "object", "anyOf"])
def test_estimate_follows_the_doubling_of_nested_schemas(wrap):
    for depth in range(1, 9):
        actual = built_len(nested(depth, wrap))
        assert actual <= estimated_regex_chars(nested(depth, wrap)) <= 5 * actual


def test_recursive_refs_are_estimated_to_outlines_cores_depth():
    tree = {
        "type": "object",
        "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}, "v": {"type": "string"}},
        "required": ["kids", "v"],
    }
    assert built_len(tree) <= estimated_regex_chars(tree) <= 5 * built_len(tree)


def test_json_depth_counts_objects_and_lists():
    assert json_depth("x") == 0
    assert json_depth({}) == 1
    assert json_depth({"a": [1, {"b": 2}]}) == 3
    assert json_depth(nested(1000, "array")) == 1001  # no recursion: past Python's limit


def test_bounds_name_the_value_the_limit_and_the_flag():
    config = EngineConfig(max_schema_depth=8, max_schema_regex_chars=4000)
    with pytest.raises(ValueError, match=r"nested 9 deep; the limit is 8 \(--max-schema-depth\)"):
        check_schema_bounds(nested(8, "array"), config, "json_schema")
    deep = nested(6, "array")
    estimate = estimated_regex_chars(deep)
    message = rf"about {estimate} characters .*the limit is 4000 \(--max-schema-regex-chars\)"
    with pytest.raises(ValueError, match=message):
        check_sampling_bounds({"json_schema": deep}, config)
    with pytest.raises(ValueError, match="--max-schema-regex-chars"):  # as JSON text too
        check_sampling_bounds({"json_schema": json.dumps(deep)}, config)
    check_sampling_bounds({"json_schema": nested(3, "array")}, config)


def test_the_regex_estimate_bounds_the_outlines_backend_only():
    """llguidance builds no regex, so a schema whose regex would be huge is its to take."""
    deep = nested(6, "array")
    for config, sp in [
        (EngineConfig(max_schema_regex_chars=4000, grammar_backend="llguidance"), {}),
        (EngineConfig(max_schema_regex_chars=4000), {"grammar_backend": "llguidance"}),
    ]:
        check_sampling_bounds({"json_schema": deep, **sp}, config)
    llguidance_engine = EngineConfig(max_schema_regex_chars=4000, grammar_backend="llguidance")
    with pytest.raises(ValueError, match="--max-schema-regex-chars"):  # a request's own pick
        check_sampling_bounds(
            {"json_schema": deep, "grammar_backend": "outlines"}, llguidance_engine
        )
    with pytest.raises(ValueError, match="--max-schema-depth"):  # depth bounds every backend
        check_sampling_bounds({"json_schema": nested(100, "array")}, llguidance_engine)


def test_counts_past_a_regex_repetition_are_refused():
    for key, value in [("maxLength", 1 << 32), ("minLength", 1 << 64), ("maxItems", 1e300)]:
        with pytest.raises(ValueError, match=re.escape(f"{key} is {value}; a count must be below")):
            check_schema_bounds({"type": "string", key: value}, EngineConfig(), "json_schema")
    inner = {"type": "array", "items": {"type": "string", "maxLength": 1 << 40}}
    assert oversized_count({"type": "object", "properties": {"a": inner}}) == ("maxLength", 1 << 40)
    assert oversized_count({"enum": [{"maxLength": 1 << 40}]}) is None  # data, not a schema
    assert oversized_count({"type": "string", "maxLength": (1 << 32) - 1}) is None


def test_schema_text_nested_past_the_json_reader_is_refused_by_name():
    text = '{"type":"array","items":' * 1200 + "{}" + "}" * 1200
    with pytest.raises(ValueError, match="--max-schema-depth"):
        check_sampling_bounds({"json_schema": text}, EngineConfig())
    check_sampling_bounds({"json_schema": "{not json"}, EngineConfig())  # the parser's to name


def _can_match_bytes_ref(regex: str) -> bool:
    """Reference: walk outlines-core's byte-level DFA (fine for small patterns only)."""
    from outlines_core import Index, Vocabulary

    tokens = {bytes([b]): [b] for b in range(256)}
    index = Index(f"(?:{regex})\\x00", Vocabulary(256, tokens))
    transitions = index.get_transitions()
    reverse: dict[int, set[int]] = {}
    for state, edges in transitions.items():
        for target in edges.values():
            reverse.setdefault(target, set()).add(state)
    live, stack = set(index.get_final_states()), list(index.get_final_states())
    while stack:
        for prev in reverse.get(stack.pop(), ()):
            if prev not in live:
                live.add(prev)
                stack.append(prev)
    return any(
        b in UNSAFE and target in live
        for state, edges in transitions.items()
        if state in live
        for b, target in edges.items()
    )


PATTERNS = [
    "[A-Z]{3}",
    '[^"\\\\\\x00-\\x1f]+',
    ".+",
    "a\\\\b",
    "[ -~]+",
    "(a|b)*a(a|b){5}",
    '(a|")*a(a|b){5}',
    'a"{0}',
    'a|"',
    r"\d+\s",
    r"\d+\w",
    r"[^a-z]",
    r"\W",
    r"\D",
    r"\S+",
    r"[\s\S]",
    r"\p{Han}{2}",
    r"\p{Lu}+",
    r"\pL+",
    r"\P{L}",
    r"\p{P}",
    r"\p{Cc}",
    r"[[:alpha:]]+",
    r"[[:cntrl:]]",
    r"[[:punct:]]",
    r"\x{4e00}",
    r"\x{22}",
    r"(?i)[a-z]+",
    r"[a-z]+@[a-z]+\.(com|org)",
    r"\t",
    "[0-9]{2,4}-[0-9]{2}",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_json_safety_matches_the_dfa_reference(pattern):
    assert can_match_unsafe(pattern) == _can_match_bytes_ref(pattern)


def test_json_safety_of_an_exploding_pattern_costs_no_automaton():
    # (a|b)*a(a|b){26} has a 2^27-state DFA; the syntax tree has a dozen nodes.
    assert can_match_unsafe("(a|b)*a(a|b){26}") is False
    assert can_match_unsafe('(a|")*a(a|b){26}') is True
    assert can_match_unsafe(r"[a-z&&[^b]]") is True  # set operations: unsure, so unsafe
    with pytest.raises(ValueError, match="nested too deeply"):
        can_match_unsafe("(" * 600 + "a" + ")" * 600)
