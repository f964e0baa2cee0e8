"""refused_as_written: a schema llguidance surely refuses as written, told by a walk of it, and
the compile that then goes to its rewrite without building the schema as written."""

from __future__ import annotations

import json
from typing import Any

import pytest
import stemma
from stemma.runtime.constrained.llguidance_grammar import known_format, with_options
from stemma.runtime.constrained.llguidance_refusal import may_be_refused, refused_as_written

DRAFT_4 = "http://json-schema.org/draft-04/schema#"
DRAFT_7 = "http://json-schema.org/draft-07/schema#"

# (schema, whether the walk finds a keyword llguidance refuses)
CASES = [
    ({"not": {"type": "string"}}, True),
    ({"type": "array", "uniqueItems": True}, True),
    ({"type": "object", "dependencies": {"a": ["b"]}}, True),
    ({"type": "string", "uniqueItems": False}, True),  # refused whatever its value
    ({"properties": {"a": {"items": {"not": {}}}}}, True),
    ({"anyOf": [{"type": "string"}, {"propertyNames": {"maxLength": 3}}]}, True),
    ({"$defs": {"a": {"not": {}}}, "properties": {"x": {"$ref": "#/$defs/a"}}}, True),
    ({"$schema": DRAFT_7, "if": {"minimum": 1}, "then": {"maximum": 3}}, True),
    ({"format": "no-such-format"}, True),
    ({"type": ["string", "integer"], "format": "no-such-format"}, True),
    # not where llguidance compiles it
    ({"properties": {"not": {"type": "string"}, "uniqueItems": {}}}, False),  # property names
    ({"$defs": {"a": {"not": {}}}, "type": "string"}, False),  # a definition nothing refers to
    ({"type": "string", "properties": {"a": {"not": {}}}}, False),  # no object can pass
    ({"type": "object", "items": {"not": {}}}, False),  # no array can pass
    ({"type": "integer", "format": "no-such-format"}, False),  # a format on numbers
    ({"enum": [{"not": 1}], "default": {"uniqueItems": True}}, False),  # data, not schemas
    ({"$schema": DRAFT_4, "if": {"minimum": 1}, "then": {"maximum": 3}}, False),  # not in draft 4
    ({"type": "string", "maxLength": 3}, False),
]


def _llguidance_refuses(schema: Any) -> bool:
    from llguidance import LLMatcher

    grammar = with_options(json.dumps(schema), {"whitespace_flexible": False})
    return LLMatcher.validate_grammar_with_warnings(grammar, None)[0]


@pytest.mark.parametrize(("schema", "found"), CASES, ids=[json.dumps(c[0]) for c in CASES])
def test_the_walk_finds_what_llguidance_refuses_where_it_compiles_it(
    schema: Any, found: bool
) -> None:
    assert refused_as_written(schema, known_format) is found
    # found: llguidance refuses it; not found here: llguidance takes it (each case is one
    # that only the place of the keyword decides)
    assert _llguidance_refuses(schema) is found


def test_a_draft_llguidance_does_not_know_is_left_to_it() -> None:
    schema = {"$schema": "http://example.com/my-draft", "not": {}}
    assert not refused_as_written(schema, known_format)


def test_the_text_scan_looks_for_keywords_only() -> None:
    assert may_be_refused(json.dumps({"not": {}}))
    assert may_be_refused(json.dumps({"properties": {"not": {}}}))  # the walk tells these apart
    assert not may_be_refused(json.dumps({"type": "string", "format": "no-such-format"}))
    assert not may_be_refused(json.dumps({"description": "not: a keyword"}))


def test_a_schema_surely_refused_compiles_from_its_rewrite_and_refuses_by_name() -> None:
    """Its rewrite is taken; where the rewrite is refused too, the refusal names the keyword
    of the schema as written, as when the schema as written was tried first."""
    c = stemma.Constraint(
        json_schema={"type": "array", "items": {"not": {"type": "string"}}}, backend="llguidance"
    )
    assert c.accepts("[1,true]") and not c.accepts('[1,"a"]')
    with pytest.raises(ValueError, match=r"keyword 'not' at #/items is not supported"):
        stemma.Constraint(
            json_schema={"type": "array", "items": {"not": {"pattern": "^a"}}},
            backend="llguidance",
        )


def test_unique_items_is_enforced_where_the_rewrite_leaves_it_out_only() -> None:
    rewritten = stemma.Constraint(
        json_schema={"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
        backend="llguidance",
    )
    assert rewritten.accepts("[1,2]") and not rewritten.accepts("[1,1]")
    # taken as written: its uniqueItems is in a definition llguidance never compiles
    unused = {"$defs": {"u": {"type": "array", "uniqueItems": True}}, "type": "array"}
    written = stemma.Constraint(json_schema=unused, backend="llguidance")
    assert written.accepts("[1,1]") and written._handle.unique is None
