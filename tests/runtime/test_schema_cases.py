"""Conditionals that test one key's value, rewritten as one split into cases
(runtime/constrained/schema_cases.py): the same instances pass, and n such conditionals make
at most n + 3 cases for llguidance, not 2^n alternatives."""

from __future__ import annotations

import itertools
import json
from typing import Any

import jsonschema
import pytest
import stemma
from stemma.runtime.constrained.schema_rewrite import rewrite_schema

INT, STR = {"type": "integer"}, {"type": "string"}
KINDS = ["a", "b", "c", "d"]
TESTS = [
    {
        "$comment": "kind a needs x, and otherwise x is at most 9",
        "if": {"properties": {"kind": {"const": "a"}}, "required": ["kind"]},
        "then": {"required": ["x"]},
        "else": {"properties": {"x": {"maximum": 9}}},
    },
    {  # without `required`: an object without kind passes the test
        "if": {"properties": {"kind": {"enum": ["a", "b"]}}},
        "then": {"required": ["y"]},
    },
    {
        "if": {"properties": {"kind": {"const": "c"}}, "required": ["kind"]},
        "then": {"properties": {"x": {"minimum": 5}}},
        "else": {"properties": {"y": {"maximum": 3}}},
    },
]


def _holder(**kw: Any) -> dict[str, Any]:
    props = {"kind": {"enum": KINDS} if kw.get("listed", True) else STR, "x": INT, "y": INT}
    schema: dict[str, Any] = {"properties": props, "allOf": [*kw.get("members", TESTS)]}
    if kw.get("object", True):
        schema = {"type": "object", **schema}
    if kw.get("required"):
        schema["required"] = ["kind"]
    return schema


KIND_IS_ONE = {"if": {"properties": {"k": {"const": 1}}, "required": ["k"]}}
HOLDERS = {  # name: (schema, the key its members test)
    "object, kind listed": (_holder(), "kind"),
    "any type, kind a string": (_holder(object=False, listed=False), "kind"),
    "kind required": (_holder(required=True), "kind"),
    "another member beside": (_holder(members=[*TESTS, {"required": ["y"]}]), "kind"),
    "numbers and booleans tested": (
        {
            "allOf": [
                {**KIND_IS_ONE, "then": {"required": ["x"]}},
                {"if": {"properties": {"k": {"enum": [True, 2]}}}, "else": {"required": ["y"]}},
            ]
        },
        "k",
    ),
}
VALUES = [*KINDS, "e", "", 1, 2, 1.5, True, False, None, [1], {"a": 1}]


ABSENT = object()


def _instances(key: str) -> list[Any]:
    """Non-objects, and objects with `key` absent or any of VALUES, x and y absent or not."""
    out: list[Any] = ["s", 3, None, [], True]
    for kind, x, y in itertools.product([ABSENT, *VALUES], [ABSENT, 1, 7, 12], [ABSENT, 2, 4]):
        fields = {key: kind, "x": x, "y": y}
        out.append({k: v for k, v in fields.items() if v is not ABSENT})
    return out


def _valid(schema: Any, value: Any) -> bool:
    return jsonschema.Draft7Validator(schema).is_valid(value)


@pytest.mark.parametrize("name", HOLDERS)
def test_the_cases_accept_exactly_what_the_conditionals_accept(name: str) -> None:
    schema, key = HOLDERS[name]
    rewritten = rewrite_schema(schema, lambda _: True).schema
    [split] = [m for m in rewritten["allOf"] if "anyOf" in m]  # one split, not one a test
    assert 2 < len(split["anyOf"]) <= len(TESTS) + 3 and '"if"' not in json.dumps(rewritten)
    verdicts = [(v, _valid(schema, v)) for v in _instances(key)]
    assert {True, False} <= {valid for _, valid in verdicts}
    for value, valid in verdicts:
        assert _valid(rewritten, value) == valid, value


def test_the_cases_grow_with_the_conditionals_not_with_their_product() -> None:
    n = 24
    names = [f"k{i}" for i in range(n)]
    members = [
        {
            "if": {"properties": {"kind": {"const": k}}, "required": ["kind"]},
            "then": {"required": [k]},
        }
        for k in names
    ]
    props = {"kind": {"enum": names}, **{k: INT for k in names}}
    schema = {"type": "object", "properties": props, "required": ["kind"], "allOf": members}
    rewritten = rewrite_schema(schema, lambda _: True).schema
    [split] = rewritten["allOf"]
    assert len(split["anyOf"]) == n  # one case a value: absent, other values, non-objects ruled out
    c = stemma.Constraint(json_schema=schema, backend="llguidance")  # 2^24 alternatives before
    assert c.accepts('{"kind":"k3","k3":1}') and not c.accepts('{"kind":"k3","k4":1}')


@pytest.mark.parametrize(
    "members",
    [
        TESTS[:1],  # one test: the conditional is rewritten alone
        [TESTS[0], {**TESTS[2], "if": {"properties": {"other": {"const": "c"}}}}],  # two keys
        [TESTS[0], {**TESTS[2], "if": {**TESTS[2]["if"], "minProperties": 1}}],  # more than a key
        [TESTS[0], {**TESTS[2], "if": {"properties": {"kind": {"type": "string"}}}}],  # no values
        [TESTS[0], {**TESTS[2], "required": ["x"]}],  # the member asserts more than its test
    ],
)
def test_members_that_do_not_all_test_one_keys_values_are_not_split(members: Any) -> None:
    schema = _holder(members=members)
    rewritten = rewrite_schema(schema, lambda _: True).schema
    assert not any("anyOf" in m and len(m["anyOf"]) > 2 for m in rewritten.get("allOf", []))
    for value in _instances("kind"):
        assert _valid(rewritten, value) == _valid(schema, value), value


def test_outputs_through_the_engine_pass_the_conditionals() -> None:
    schema, _ = HOLDERS["object, kind listed"]
    c = stemma.Constraint(json_schema=schema, backend="llguidance")
    for value in _instances("kind"):
        if isinstance(value, dict) and all(k in ("kind", "x", "y") for k in value):
            text = json.dumps(value, separators=(",", ":"))
            assert c.accepts(text) == _valid(schema, value), value


def test_a_split_not_made_rewrites_each_member_once() -> None:
    # an array among the tested values of a key the holder does not list: "any other value"
    # is no schema, so each member is rewritten as it stands, its notes said once
    then = {"properties": {"note": {"type": "string", "format": "no-such-format"}}}
    members = [{**TESTS[0], "then": then}, {"if": {"properties": {"kind": {"const": [1]}}}}]
    schema = _holder(members=members, listed=False)
    rewritten, notes = rewrite_schema(schema, lambda name: name != "no-such-format")[:2]
    assert len([n for n in notes if "no-such-format" in n]) == 1
    for value in _instances("kind"):
        assert _valid(rewritten, value) == _valid(schema, value), value
