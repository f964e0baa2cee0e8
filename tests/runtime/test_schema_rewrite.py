"""Exact rewrites of the keywords llguidance cannot compile as written (schema_rewrite.py): each
rewritten schema accepts exactly what `jsonschema` says the original accepts, through the real
llguidance backend; negations are checked against `jsonschema` alone; what cannot be rewritten
exactly is still refused by name."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
import stemma
from stemma.runtime.constrained.schema_rewrite import rewrite_schema

INT, STR = {"type": "integer"}, {"type": "string"}
UNIQUE_TAGS = {"type": "array", "items": STR, "uniqueItems": True}


def _valid(schema: Any, value: Any) -> bool:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return cls(schema).is_valid(value)


# (schema, instances): every case has instances on both sides. Object instances list their
# keys in the schema's order, the order llguidance emits them in.
EXACT = [
    (
        {"type": "object", "properties": {"a": INT, "b": INT}, "dependencies": {"a": ["b"]}},
        [{}, {"a": 1}, {"a": 1, "b": 2}, {"b": 2}],
    ),
    (
        {"properties": {"a": INT, "c": INT}, "dependencies": {"a": {"required": ["c"]}}},
        [{"a": 1}, {"a": 1, "c": 2}, {"c": 2}, 5],
    ),
    (
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "properties": {"a": INT, "b": INT},
            "dependentRequired": {"b": ["a"]},
        },
        [{"b": 1}, {"a": 1, "b": 1}, {"a": 1}],
    ),
    (
        {"type": "object", "properties": {"a": INT, "b": INT}, "not": {"required": ["a", "b"]}},
        [{}, {"a": 1}, {"b": 1}, {"a": 1, "b": 2}],
    ),
    ({"not": {"type": "string"}}, ["x", 1, None, [1], {"k": 1}, True]),
    ({"type": "string", "not": {"enum": ["ab", "a", "", "a]"]}}, ["ab", "a", "", "abc", "b", "a]"]),
    ({"type": "integer", "not": {"const": 3}}, [2, 3, 4]),
    ({"type": "number", "not": {"enum": [1, 2.5]}}, [1, 2.5, 1.5, 0, 3]),
    ({"not": {"anyOf": [{"type": "string"}, {"type": "null"}]}}, ["x", None, 1, False]),
    ({"type": "string", "not": {"minLength": 3}}, ["ab", "abc", ""]),
    ({"type": "array", "not": {"maxItems": 1}}, [[], [1], [1, 2]]),
    ({"type": "number", "not": {"minimum": 2, "maximum": 5}}, [1, 2, 5, 6, 3.5]),
    ({"not": {"properties": {"a": STR}, "required": ["a"]}}, [{"a": "x"}, {"a": 1}, {}, 3]),
    ({"oneOf": [{"const": 1, "note": "one"}, {"const": 2}]}, [1, 2, 3]),
    (
        {
            "type": "object",
            "properties": {"a": INT, "b": INT, "c": INT},
            "oneOf": [{"required": ["a"]}, {"required": ["b", "c"]}],
        },
        [{"a": 1}, {"b": 1, "c": 1}, {"a": 1, "b": 1, "c": 1}, {"a": 1, "b": 1}, {}],
    ),
    (
        {
            "oneOf": [
                {"properties": {"kind": {"const": "x"}, "n": INT}, "required": ["kind"]},
                {"properties": {"kind": {"const": "y"}, "s": STR}, "required": ["kind"]},
            ]
        },
        [{"kind": "x", "n": 1}, {"kind": "y", "s": "t"}, {"kind": "z"}, {"kind": "x", "n": "1"}],
    ),
    (
        {
            "type": "object",
            "properties": {"kind": STR, "n": INT},
            "if": {"properties": {"kind": {"const": "num"}}},
            "then": {"required": ["n"]},
            "else": {"properties": {"n": False}},
        },
        [{"kind": "num", "n": 1}, {"kind": "num"}, {"kind": "str"}, {"kind": "str", "n": 1}],
    ),
    ({"type": "array", "maxItems": 1, "uniqueItems": True}, [[], [1], [1, 1]]),
    # a listed set beside what llguidance refuses: the listed values that pass
    (
        {"allOf": [{"enum": [1.1, 2, "x", None]}, {"not": {"type": ["integer", "string"]}}]},
        [1.1, 2, "x", None, 3],
    ),
    (
        {
            "$defs": {"s": {"type": "string"}},
            "allOf": [{"$ref": "#/$defs/one"}, {"not": {"not": {"not": {"$ref": "#/$defs/s"}}}}],
        }
        | {"$defs": {"s": {"type": "string"}, "one": {"enum": ["a", 1, {"k": [1]}]}}},
        ["a", 1, {"k": [1]}, 2],
    ),
    ({"type": "integer", "enum": [1, 2, 3], "oneOf": [{"minimum": 2}, {"maximum": 2}]}, [1, 2, 3]),
    # closed objects overlap only where no key of one is there: "not the other" by its keys
    (
        {
            "oneOf": [
                {"type": "object", "additionalProperties": False, "properties": {"foo": STR}},
                {
                    "additionalProperties": False,
                    "properties": {"bar": STR, "baz": {"type": "boolean"}},
                },
            ]
        },
        [{}, {"foo": "x"}, {"bar": "y"}, {"baz": True}, {"foo": "x", "bar": "y"}, {"bar": 1}, 3],
    ),
    # property counts: implied ones dropped, "at least one" and "at most one" by name
    ({"properties": {"a": INT, "b": INT}, "minProperties": 0}, [{}, {"a": 1}, {"a": "x"}]),
    (
        {
            "type": "object",
            "properties": {"a": INT, "b": INT},
            "required": ["a"],
            "minProperties": 1,
        },
        [{"a": 1}, {"b": 1}, {"a": 1, "b": 2}],
    ),
    (
        {
            "type": "object",
            "properties": {"a": INT, "b": INT},
            "additionalProperties": False,
            "maxProperties": 2,
        },
        [{}, {"a": 1, "b": 2}, {"c": 1}],
    ),
    (
        {"type": "object", "properties": {"a": INT, "b": STR}, "minProperties": 1},
        [{}, {"a": 1}, {"b": "x"}, {"z": None}, {"a": "x"}, {"a": 1, "z": 2}],
    ),
    (
        {
            "type": "object",
            "properties": {"a": INT, "b": STR},
            "minProperties": 1,
            "maxProperties": 1,
        },
        [{}, {"a": 1}, {"b": "x"}, {"z": None}, {"a": 1, "b": "x"}, {"a": 1, "z": 2}],
    ),
    (
        {"type": "object", "properties": {"a": INT}, "maxProperties": 1},
        [{}, {"a": 1}, {"z": 1}, {"a": 1, "z": 2}, {"y": 1, "z": 2}, {"a": "x"}],
    ),
    # uniqueItems enforced beside the grammar (unique_items.py)
    (UNIQUE_TAGS, [[], ["a"], ["a", "b"], ["a", "a"], ["a", "ab", "a"], ["ab", "a"]]),
    (
        {"type": "array", "items": {"type": "number"}, "uniqueItems": True},
        [[1, 2], [1, 1.0], [1, 10, 1], [0.5, 5], [-1, 1]],
    ),
    (
        {"type": "array", "uniqueItems": True},
        [[True, 1], [None, None], [[1], [1, 2]], [[1], [1]], [{"a": 1, "b": 2}, {"a": 1, "b": 2}]],
    ),
    (
        {"type": "object", "properties": {"tags": UNIQUE_TAGS, "free": {"type": "array"}}},
        [{"tags": ["x", "y"], "free": [1, 1]}, {"tags": ["x", "x"]}, {"free": ["x", "x"]}],
    ),
    (  # through $ref, items and additionalProperties
        {
            "$defs": {"set": {"type": "array", "items": INT, "uniqueItems": True}},
            "type": "object",
            "properties": {"rows": {"type": "array", "items": {"$ref": "#/$defs/set"}}},
            "additionalProperties": {"$ref": "#/$defs/set"},
        },
        [
            {"rows": [[1, 2], [1, 2]]},
            {"rows": [[1, 2], [2, 2]]},
            {"rows": [], "k": [3, 4]},
            {"rows": [], "k": [3, 3]},
        ],
    ),
    (  # the only branch that admits an array
        {"properties": {"ids": {"oneOf": [STR, {"type": "array", "uniqueItems": True}]}}},
        [{"ids": "a"}, {"ids": ["a", "b"]}, {"ids": ["a", "a"]}],
    ),
    # propertyNames as keys matched by a pattern or named, in a closed conjunct
    (
        {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}},
        [{}, {"ab": 1}, {"aB": 1}, {"ab": 1, "1": 2}],
    ),
    (
        {"type": "object", "properties": {"x": INT}, "propertyNames": {"enum": ["x", "y"]}},
        [{"x": 1}, {"y": "s"}, {"z": 1}, {"x": "a"}],
    ),
    (
        {"$defs": {"n": {"minLength": 1, "maxLength": 2}}, "propertyNames": {"$ref": "#/$defs/n"}},
        [{"ab": 1}, {"abc": 1}, {"": 1}, "not an object"],
    ),
    ({"propertyNames": {"type": "string"}, "additionalProperties": INT}, [{"a": 1}, {"a": "x"}]),
    ({"propertyNames": False}, [{}, {"a": 1}, [1]]),
    # a `type` its anyOf already implies, beside recursive $refs: left out
    (
        {
            "definitions": {
                "node": {
                    "type": "object",
                    "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/kid"}}},
                    "required": ["kids"],
                    "additionalProperties": False,
                },
                "leaf": {"type": "object", "properties": {"v": INT}, "required": ["v"]},
            },
            "$defs": {
                "kid": {
                    "type": "object",
                    "anyOf": [{"$ref": "#/definitions/node"}, {"$ref": "#/definitions/leaf"}],
                }
            },
            "$ref": "#/definitions/node",
        },
        [
            {"kids": []},
            {"kids": [{"v": 1}, {"kids": [{"v": 2}]}]},
            {"kids": [{"v": "x"}]},
            {"kids": [{}]},
            {"kids": [3]},
        ],
    ),
    # a listed property that a matching pattern already says: left to the pattern
    (
        {
            "definitions": {
                "node": {"type": "object", "properties": {"next": {"$ref": "#/definitions/node"}}}
            },
            "type": "object",
            "properties": {"head": {"$ref": "#/definitions/node", "title": "first"}},
            "patternProperties": {"^h": {"$ref": "#/definitions/node"}},
        },
        [{"head": {"next": {}}}, {"head": {"next": 1}}, {"hx": {"next": {"next": {}}}}, {"x": 1}],
    ),
    # a pattern matching every key beside another: additionalProperties, and within the other
    (
        {"type": "object", "patternProperties": {".*": STR, "^a": {"maxLength": 2}}},
        [{"ab": "x"}, {"ab": "xyz"}, {"b": "xyz"}, {"b": 1}, {"ab": 1}],
    ),
    # then / else without if assert nothing
    ({"type": "object", "then": {"required": ["a"]}, "else": False}, [{}, {"a": 1}, 3]),
    # a recursive $ref that llguidance would intersect with its siblings: its target instead
    (
        {
            "type": "object",
            "required": ["type"],
            "properties": {"type": STR, "note": STR},
            "oneOf": [{"$ref": "#/definitions/leaf"}, {"$ref": "#/definitions/group"}],
            "definitions": {
                "leaf": {"properties": {"type": {"enum": ["leaf"]}, "n": INT}},
                "group": {
                    "required": ["items"],
                    "properties": {"type": {"enum": ["group"]}, "items": {"items": {"$ref": "#"}}},
                },
            },
        },
        [
            {"type": "leaf", "n": 1},
            {"type": "group", "items": [{"type": "leaf"}, {"type": "group", "items": []}]},
            {"type": "group", "items": [{"type": "other"}]},
            {"type": "leaf", "n": "x"},
            {"type": "group"},
        ],
    ),
]


TAGGED = {
    "type": "object",
    "required": ["kind"],
    "properties": {"kind": STR},
    "oneOf": [
        {"properties": {"kind": {"const": "a"}, "x": {"type": "string", "pattern": "^a"}}},
        {"properties": {"kind": {"enum": ["b", "c"]}}},
    ],
}
EXACT.append(
    (TAGGED, [{"kind": "a", "x": "ab"}, {"kind": "a", "x": "b"}, {"kind": "b", "x": "z"}, {}])
)


def test_branches_told_apart_by_a_key_the_holder_requires_are_an_any_of() -> None:
    """Neither branch requires `kind`, but the object holding the `oneOf` does, and each
    branch lists its own values for it: no instance matches both, as written."""
    rewritten = rewrite_schema(TAGGED, lambda _: True).schema
    assert rewritten["anyOf"] == TAGGED["oneOf"] and "oneOf" not in rewritten
    optional = {**TAGGED, "required": []}  # {} would match both: not an anyOf
    assert rewrite_schema(optional, lambda _: True)[0].get("anyOf") != TAGGED["oneOf"]


@pytest.mark.parametrize(("schema", "instances"), EXACT, ids=lambda x: json.dumps(x)[:50])
def test_rewrite_accepts_exactly_the_valid_instances(schema: Any, instances: list[Any]) -> None:
    verdicts = [_valid(schema, v) for v in instances]
    assert True in verdicts and False in verdicts  # both sides are exercised
    c = stemma.Constraint(json_schema=schema, backend="llguidance")
    for value, valid in zip(instances, verdicts):
        assert c.accepts(json.dumps(value, separators=(",", ":"))) == valid, value


NEGATABLE = [
    {"type": ["string", "null"]},
    {"enum": [True, None, "a"]},
    {"const": False},
    {"required": ["a"], "properties": {"a": {"enum": ["x", "y"]}}},
    {"allOf": [{"minimum": 0}, {"exclusiveMaximum": 10}]},
    {"anyOf": [{"maxLength": 1}, {"type": "array", "minItems": 2}]},
    {"not": {"type": "number"}},
    {"title": "only annotations", "x-vendor": 1},
    {"$ref": "#/$defs/s", "$defs": {"s": {"type": "string", "minLength": 2}}},
]
VALUES = [None, True, False, 0, 1, 5, 10, -2.5, "", "a", "ab", "x", [], [1, 2], {}, {"a": "x"}]
VALUES += [{"a": "z"}, {"b": 1}]


@pytest.mark.parametrize("schema", NEGATABLE, ids=lambda x: json.dumps(x)[:40])
def test_negation_is_the_complement(schema: Any) -> None:
    negated = rewrite_schema({**schema_defs(schema), "not": schema}, lambda _: True).schema
    assert "not" not in negated
    for value in VALUES:
        assert _valid(negated, value) == (not _valid(schema, value)), value


def schema_defs(schema: Any) -> dict[str, Any]:
    """The $defs a $ref inside the negated schema points at, beside the `not`."""
    return {"$defs": schema["$defs"]} if "$defs" in schema else {}


STILL_REFUSED = [
    ({"type": "string", "not": {"pattern": "^a"}}, "not", "#"),
    ({"properties": {"n": {"oneOf": [INT, {"type": "number"}]}}}, "oneOf", "#/properties/n"),
    ({"if": {"type": "integer"}, "then": {"minimum": 1}}, "if", "#"),
    (
        {"patternProperties": {"\\p{L}": {"type": "array", "uniqueItems": True}}},
        "uniqueItems",
        "#/patternProperties/\\p{L}",
    ),
    # exact, but past the growth bound: 10 branches of 3 required keys
    (
        {"oneOf": [{"required": [f"k{i}{j}" for j in range(3)]} for i in range(10)]},
        "oneOf",
        "#",
    ),
]


@pytest.mark.parametrize(("schema", "keyword", "path"), STILL_REFUSED, ids=lambda x: str(x)[:30])
def test_what_cannot_be_rewritten_exactly_is_refused_by_name(
    schema: Any, keyword: str, path: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(f"keyword '{keyword}' at {path} ")):
        stemma.Constraint(json_schema=schema, backend="llguidance")


def test_an_unknown_format_is_an_annotation_and_says_so() -> None:
    c = stemma.Constraint(json_schema={"type": "string", "format": "color"}, backend="llguidance")
    assert c.accepts('"red"') and not c.accepts("1")
    assert any("'color' at #" in w and "annotation" in w for w in c.warnings)
    checked = stemma.Constraint(json_schema={"type": "string", "format": "date"})
    assert not checked.accepts('"red"')  # a format llguidance knows is still checked


@pytest.mark.parametrize(
    ("kinds", "branches", "implied"),
    [
        ("object", [{"$ref": "#/$defs/o"}, {"type": "object", "required": ["a"]}], True),
        (["object", "null"], [{"$ref": "#/$defs/o"}, {"type": "null"}], True),
        ("object", [{"$ref": "#/$defs/o"}, STR], False),  # a string passes the anyOf
        ("integer", [{"type": "number"}, {"$ref": "#/$defs/o"}], False),  # 1.5 is a number
    ],
)
def test_a_type_the_branches_imply_is_left_out(kinds: Any, branches: Any, implied: bool) -> None:
    """llguidance cannot intersect a recursive $ref with siblings, even a `type` it implies."""
    schema = {
        "$defs": {"o": {"type": "object", "properties": {"o": {"$ref": "#/$defs/o"}}}},
        "not": {"required": ["x"]},  # something to rewrite
        "properties": {"v": {"type": kinds, "anyOf": branches}},
    }
    kept = rewrite_schema(schema, lambda _: True)[0]["properties"]["v"]
    assert ("type" not in kept) == implied
    defs = schema["$defs"]
    for value in [{"o": {}}, {"a": 1}, None, "s", 1.5, 2]:  # the same instances pass
        assert _valid({**kept, "$defs": defs}, value) == _valid(
            {**schema["properties"]["v"], "$defs": defs}, value
        )


def _multiplying_refs(width: int) -> dict[str, Any]:
    """Recursive definitions, each intersecting all of them: every inlined copy holds `width`
    references to inline in turn, so the copies multiply by `width` per level."""
    names = [f"n{i}" for i in range(width)]
    padding = {f"p{j}": {"type": "string", "description": "x" * 40} for j in range(8)}
    node = {
        "type": "object",
        "properties": padding,
        "allOf": [{"$ref": f"#/$defs/{n}"} for n in names],
    }
    return {"$defs": {n: node for n in names}, "$ref": "#/$defs/n0"}


def test_inlining_recursive_refs_stops_at_its_size_bound() -> None:
    """Copies inside copies stop being made once their JSON passes the bound (a schema of the
    sample spent 9 s here before refusing), and the schema is then left as written."""
    from stemma.runtime.constrained import schema_refs

    schema = _multiplying_refs(6)
    size = len(json.dumps(schema))
    walked = 0
    walk = schema_refs._Inliner.walk

    def counting_walk(self, node, nesting=0):
        nonlocal walked
        walked += 1
        return walk(self, node, nesting)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(schema_refs._Inliner, "walk", counting_walk)
        with pytest.raises(schema_refs.TooLarge):
            schema_refs.inline_cyclic_refs(schema, 4 * size)
    assert walked < 40 * size // 100  # the nodes of about 4 schemas' worth of copies
    assert rewrite_schema(schema, lambda name: True) == (schema, [], None, None)
