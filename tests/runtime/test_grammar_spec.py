"""Front doors and up-front validation: regex, JSON schema, choices, dtype -> one regex, and
every regex feature or schema keyword outlines-core cannot honour reported by name."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from outlines_core.json_schema import build_regex_from_schema
from pydantic import BaseModel
from stemma.runtime.constrained.regex_check import normalize_regex
from stemma.runtime.constrained.schema_check import schema_issues
from stemma.runtime.constrained.spec import ConstraintSpec, constraint_regex, resolve


class Weather(BaseModel):
    city: str
    days: int
    metric: bool = True


def test_front_doors_build_expected_regexes() -> None:
    assert constraint_regex(regex="^[0-9]+$") == "[0-9]+"
    assert constraint_regex(choices=["a.b", "c|d", "e"]) == r"(a\.b|c\|d|e)"
    assert constraint_regex(dtype=int) == constraint_regex(dtype="int")
    assert re.fullmatch(constraint_regex(dtype=float), "-1.5e3")
    assert re.fullmatch(constraint_regex(dtype=bool), "True")
    assert re.fullmatch(constraint_regex(dtype=str), '"a \\"q\\" b"')
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    compact = constraint_regex(json_schema=schema)
    assert compact == constraint_regex(json_schema=json.dumps(schema))
    assert re.fullmatch(compact, '{"a":12}') and not re.fullmatch(compact, '{"a": 12}')
    assert re.fullmatch(constraint_regex(json_schema=schema, whitespace=r"[ ]?"), '{ "a": 1 }')


def test_pydantic_model_front_door() -> None:
    regex = constraint_regex(json_schema=Weather)
    assert re.fullmatch(regex, '{"city":"Paris","days":3,"metric":false}')
    assert re.fullmatch(regex, '{"city":"Paris","days":3}')
    assert not re.fullmatch(regex, '{"days":3}')


def test_spec_normalization_and_keys() -> None:
    a = ConstraintSpec.create(json_schema={"type": "integer"})
    b = ConstraintSpec.create(json_schema='{"type": "integer"}')
    assert a.key == b.key
    assert ConstraintSpec.create(dtype=int) == ConstraintSpec(dtype="int")
    assert ConstraintSpec.create(choices=["x"]).key != ConstraintSpec.create(regex="(x)").key
    with pytest.raises(ValueError, match="exactly one"):
        ConstraintSpec(regex="a", dtype="int")
    with pytest.raises(ValueError, match="dtype"):
        ConstraintSpec(dtype="complex")
    with pytest.raises(TypeError, match="choices"):
        ConstraintSpec.create(choices="abc")
    with pytest.raises(ValueError, match="not valid JSON"):
        ConstraintSpec.create(json_schema="{nope")


def test_escape_regex_round_trips_every_meta_character() -> None:
    text = r"a.b*c+d?e(f)g[h]i{j}k|l^m$n\o#p&q-r~s t"
    assert re.fullmatch(constraint_regex(choices=[text]), text)


@pytest.mark.parametrize(
    ("regex", "feature"),
    [
        (r"(?=a)a", "lookahead"),
        (r"a(?!b)", "negative lookahead"),
        (r"(?<=a)b", "lookbehind"),
        (r"(?<!a)b", "negative lookbehind"),
        (r"(a)\1", "backreference"),
        (r"(?P<x>a)(?P=x)", "backreference"),
        (r"\bword\b", "word boundary"),
        (r"a^b", "anchor ^"),
        (r"(a$|b)c", "anchor $"),
        (r"\Aab", "anchor"),
        (r"a*?", "lazy quantifier"),
        (r"a{2,3}?", "lazy quantifier"),
        (r"a++", "possessive quantifier"),
        (r"(?>ab)", "atomic group"),
        (r"(?U)a*", "ungreedy"),
    ],
)
def test_unsupported_regex_features_are_named(regex: str, feature: str) -> None:
    with pytest.raises(ValueError, match=re.escape(feature)):
        normalize_regex(regex)


@pytest.mark.parametrize(
    "regex",
    [r"[\^$]+", r"\$[0-9]+", r"[a-z&&[^b]]", r"\p{Han}{2}", r"\x{4e00}", r"(?i)abc", r"a{2}b?"],
)
def test_supported_regexes_pass_the_scan(regex: str) -> None:
    assert normalize_regex(regex) == regex


def test_anchors_at_the_ends_are_dropped_but_escaped_dollar_kept() -> None:
    assert normalize_regex("^(a|b)$") == "(a|b)"
    assert normalize_regex(r"cost \$") == r"cost \$"
    assert normalize_regex(r"a\\$") == "a\\\\"


# Keyword -> a schema using it. Each is an assertion outlines-core 0.2.14 drops silently.
IGNORED = {
    "minimum": {"type": "integer", "minimum": 3},
    "maximum": {"type": "number", "maximum": 3},
    "exclusiveMinimum": {"type": "integer", "exclusiveMinimum": 3},
    "exclusiveMaximum": {"type": "integer", "exclusiveMaximum": 3},
    "multipleOf": {"type": "integer", "multipleOf": 3},
    "uniqueItems": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
    "contains": {"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}},
    "patternProperties": {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
    "propertyNames": {"type": "object", "propertyNames": {"maxLength": 3}},
    "maxProperties": {"type": "object", "maxProperties": 1},
    "dependentRequired": {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "dependentRequired": {"a": ["b"]},
    },
    "not": {"type": "integer", "not": {"const": 3}},
    "if": {"type": "integer", "if": {"const": 1}, "then": {"const": 1}},
    "pattern": {"type": "string", "pattern": "[a-z]+", "maxLength": 4},
    "format": {"type": "string", "pattern": "[a-z]+@[a-z]+", "format": "email"},
    "required": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["z"]},
    "allOf": {"allOf": [{"type": "integer"}, {"type": "integer"}]},
    "oneOf": {"oneOf": [{"type": "integer"}, {"type": "number"}]},
    "type": {"type": "string", "properties": {"a": {"type": "integer"}}},
    "maxLength": {"enum": ["abc", "abcdef"], "maxLength": 4},
}


@pytest.mark.parametrize("keyword", sorted(IGNORED))
def test_ignored_schema_keywords_are_rejected_by_name(keyword: str) -> None:
    spec = ConstraintSpec.create(json_schema=IGNORED[keyword])
    with pytest.raises(ValueError, match=re.escape(keyword)):
        resolve(spec)
    loose = resolve(ConstraintSpec.create(json_schema=IGNORED[keyword], strict=False))
    assert any(keyword in w for w in loose.warnings)


DROPPED_BY_OUTLINES = [k for k in IGNORED if k not in ("required", "allOf", "oneOf", "type")]


@pytest.mark.parametrize("keyword", DROPPED_BY_OUTLINES)
def test_outlines_core_really_ignores_what_we_reject(keyword: str) -> None:
    """Guards the list against an outlines-core upgrade that starts honouring a keyword."""
    schema = IGNORED[keyword]
    without = {k: v for k, v in schema.items() if k != keyword and k != "then"}
    assert build_regex_from_schema(json.dumps(schema)) == build_regex_from_schema(
        json.dumps(without)
    )


def test_nested_issues_carry_their_path() -> None:
    schema = {
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 0},
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            "pt": {"$ref": "#/$defs/p"},
        },
        "$defs": {"p": {"type": "number", "multipleOf": 2}},
    }
    assert schema_issues(schema) == [
        "#/properties/age: minimum",
        "#/properties/tags: uniqueItems",
        "#/$defs/p: multipleOf",
    ]


def test_annotations_and_harmless_keywords_pass() -> None:
    schema = Weather.model_json_schema()
    schema["additionalProperties"] = False
    schema["description"] = "x"
    assert schema_issues(schema) == []
    discriminated = {
        "oneOf": [{"const": "a"}, {"const": "b"}],
        "discriminator": {"propertyName": "k"},
    }
    assert schema_issues(discriminated) == []


@pytest.mark.parametrize(
    ("pattern", "is_safe"),
    [
        ("^[A-Z]{3}$", True),
        ('[^"\\\\\\x00-\\x1f]+', True),
        (".+", False),
        ("a\\\\b", False),
        ("[ -~]+", False),
    ],
)
def test_string_patterns_that_break_json_are_reported(pattern: str, is_safe: bool) -> None:
    issues = schema_issues({"type": "string", "pattern": pattern})
    assert (issues == []) == is_safe


def test_email_and_uri_formats_use_json_safe_patterns() -> None:
    regex = constraint_regex(json_schema={"type": "string", "format": "email"})
    assert re.fullmatch(regex, '"ann.lee@mail.example.org"')
    assert not re.fullmatch(regex, '""q"@a.bc"')
    uri = constraint_regex(json_schema={"type": "string", "format": "uri"})
    assert re.fullmatch(uri, '"https://example.com/a/b"')


def test_outlines_core_errors_are_wrapped() -> None:
    with pytest.raises(ValueError, match="not supported by the outlines grammar backend.*ipv4"):
        resolve(ConstraintSpec.create(json_schema={"type": "string", "format": "ipv4"}))


def _schema(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props)}


def test_required_subset_and_min_properties_accounting() -> None:
    assert schema_issues(_schema(a={"type": "integer"}) | {"minProperties": 1}) == []
    assert schema_issues(_schema(a={"type": "integer"}) | {"minProperties": 2}) == [
        "#: minProperties"
    ]
