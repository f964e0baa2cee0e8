"""The official JSON-Schema-Test-Suite (draft 2020-12, vendored in tests/data/json_schema_suite/)
through `stemma.Constraint` with the llguidance backend.

Each group's schema is compiled once. A refusal (ValueError) is allowed: it is how stemma says a
grammar cannot express a keyword exactly. A compiled schema must decide every in-scope instance
right, as its compact JSON (`compact`) tokenized by SmolLM2: valid accepted, invalid refused.
Floors on compiled groups and checked instances keep the module from passing by refusing.

What is in scope is decided from the schema and the instance alone, before stemma runs:
- A group is out when its schema has a `$ref` not starting with "#": the target is another
  document (the suite's remotes/, a metaschema), which stemma does not fetch.
- Every invalid instance is in: whatever its form, accepting it is wrong. A valid instance is
  out when its compact text is not a form the grammar writes, as stemma refuses such a text by
  design (its one way to write an object, its number forms):
  - it holds a float with an integral value (1.0, -2.0): JSON Schema counts it as the integer,
    which the grammar writes without a fraction (out even under `number`, which may write 1.0:
    the rule reads the instance, not which subschema holds each value);
  - it holds an object whose keys break the schema's key order (`key_order`). The grammar
    writes the names in `properties` first, in declared order, then names that are only in
    `required` (or `dependentRequired`) lists, in listed order, then other keys in any order;
    objects in `const`/`enum` values are written as given. Over a whole schema each name takes
    its first mention, depth first in document order.
- The optional/format files assume `format` asserts, which 2020-12 leaves to the validator;
  stemma asserts the formats llguidance knows, and only those files are vendored.
Cases stemma decides wrong stay in KNOWN_WRONG, asserted to be still wrong until fixed.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import stemma
from stemma.bench.schema_coverage import compact

SUITE_DIR = Path(__file__).parents[1] / "data" / "json_schema_suite" / "draft2020-12"
# Measured: 201 of the 225 local groups compile, holding 1164 in-scope instances; a change
# that refuses more, or checks fewer, fails here.
MIN_COMPILED_GROUPS = 201
MIN_CHECKED_INSTANCES = 1164
_MAPS_OF_SUBSCHEMAS = frozenset({"properties", "patternProperties", "$defs", "dependentSchemas"})
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})  # values are data


def _cases(file: str, group: str, reason: str, *tests: str) -> dict[tuple[str, str, str], str]:
    return {(file, group, test): reason for test in tests}


_FORMAT = "optional/format/"
_LEAP_SECOND = "a leap second (:60) is accepted at any time; RFC 3339 allows it at 23:59 UTC only"
_PUNYCODE = "an A-label (xn--...) is not decoded, so what it encodes is never checked"
# (file, group description, test description) -> why stemma decides it wrong.
KNOWN_WRONG: dict[tuple[str, str, str], str] = {
    **_cases(
        "optional/ecmascript-regex.json",
        "ECMA 262 \\s matches whitespace",
        "pattern \\s: U+FEFF is whitespace in ECMA-262, not in llguidance's regex: refused",
        "zero-width whitespace matches",
    ),
    **_cases(
        "optional/ecmascript-regex.json",
        "ECMA 262 \\S matches everything but whitespace",
        "pattern \\S: U+FEFF is whitespace in ECMA-262, not in llguidance's regex: accepted",
        "zero-width whitespace does not match",
    ),
    **_cases(
        f"{_FORMAT}date-time.json",
        "validation of date-time strings",
        _LEAP_SECOND,
        "an invalid date-time with leap second on a wrong minute, UTC",
        "an invalid date-time with leap second on a wrong hour, UTC",
    ),
    **_cases(
        f"{_FORMAT}date.json",
        "validation of date strings",
        "February 29 is accepted in every year, leap or not",
        "2021 is not a leap year",
        "century year 0100 is not a leap year",
        "century year 2100 is not a leap year",
    ),
    **_cases(
        f"{_FORMAT}email.json",
        "validation of e-mail addresses",
        "a quoted local part or an IPv6 address literal (RFC 5321) is refused",
        "a quoted string with a space in the local part is valid",
        "a quoted string with a double dot in the local part is valid",
        "a quoted string with a @ in the local part is valid",
        "an IPv6-address-literal after the @ is valid",
    ),
    **_cases(
        f"{_FORMAT}hostname.json",
        "validation of host names",
        "a name over 253 characters is accepted",
        "exceeds maximum overall length (256)",
    ),
    **_cases(
        f"{_FORMAT}hostname.json",
        "validation of A-label (punycode) host names",
        _PUNYCODE,
        "invalid Punycode",
        "contains illegal char U+302E Hangul single dot tone mark",
        "Begins with a Spacing Combining Mark",
        "Begins with a Nonspacing Mark",
        "Begins with an Enclosing Mark",
        "Exceptions that are DISALLOWED, right-to-left chars",
        "Exceptions that are DISALLOWED, left-to-right chars",
        "MIDDLE DOT with no preceding 'l'",
        "MIDDLE DOT with nothing preceding",
        "MIDDLE DOT with no following 'l'",
        "MIDDLE DOT with nothing following",
        "Greek KERAIA not followed by Greek",
        "Greek KERAIA not followed by anything",
        "Hebrew GERESH not preceded by Hebrew",
        "Hebrew GERESH not preceded by anything",
        "Hebrew GERSHAYIM not preceded by Hebrew",
        "Hebrew GERSHAYIM not preceded by anything",
        "KATAKANA MIDDLE DOT with no Hiragana, Katakana, or Han",
        "KATAKANA MIDDLE DOT with no other characters",
        "Arabic-Indic digits mixed with Extended Arabic-Indic digits",
        "ZERO WIDTH JOINER not preceded by Virama",
        "ZERO WIDTH JOINER not preceded by anything",
        'contains "--" in the 3rd and 4th position',
    ),
    **_cases(
        f"{_FORMAT}ipv6.json",
        "validation of IPv6 addresses",
        "an address ending in dotted IPv4 (RFC 4291 2.2, form 3) is refused",
        "mixed format with the ipv4 section as decimal octets",
        "mixed format with double colons between the sections",
        "mixed format with leading double colons (ipv4-mapped ipv6 address)",
        "a long valid ipv6",
    ),
    **_cases(
        f"{_FORMAT}time.json",
        "validation of time strings",
        _LEAP_SECOND,
        "invalid leap second, Zulu (wrong hour)",
        "invalid leap second, Zulu (wrong minute)",
        "invalid leap second, zero time-offset (wrong hour)",
        "invalid leap second, zero time-offset (wrong minute)",
        "invalid leap second, positive time-offset (wrong hour)",
        "invalid leap second, positive time-offset (wrong minute)",
        "invalid leap second, negative time-offset (wrong hour)",
        "invalid leap second, negative time-offset (wrong minute)",
        "an invalid time string with invalid leap second (wrong hour)",
        "an invalid time string with invalid leap second (wrong minute)",
    ),
}


class Group(NamedTuple):
    file: str  # under draft2020-12/
    description: str
    schema: Any
    tests: list[dict[str, Any]]


def _load_groups() -> list[Group]:
    return [
        Group(path.relative_to(SUITE_DIR).as_posix(), g["description"], g["schema"], g["tests"])
        for path in sorted(SUITE_DIR.rglob("*.json"))
        for g in json.loads(path.read_text(encoding="utf-8"))
    ]


def refs(node: Any) -> list[str]:
    """Every `$ref` value in a schema (none from inside `const`/`enum` data)."""
    if isinstance(node, list):
        return [r for item in node for r in refs(item)]
    if not isinstance(node, dict):
        return []
    found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
    return found + [r for k, v in node.items() if k not in _DATA_KEYWORDS for r in refs(v)]


def key_order(schema: Any) -> dict[str, tuple[int, int]]:
    """Each key the schema names -> (tier, rank): tier 0 for `properties` names and keys of
    `const`/`enum` objects, 1 for names only in `required` lists; rank is the first mention."""
    declared: list[str] = []
    required: list[str] = []
    _collect_names(schema, declared, required)
    order = {k: (1, i) for i, k in enumerate(dict.fromkeys(required))}
    return order | {k: (0, i) for i, k in enumerate(dict.fromkeys(declared))}


def _collect_names(node: Any, declared: list[str], required: list[str]) -> None:
    if isinstance(node, list):
        for item in node:
            _collect_names(item, declared, required)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key in _MAPS_OF_SUBSCHEMAS and isinstance(value, dict):
            declared.extend(value if key == "properties" else ())
            for sub in value.values():
                _collect_names(sub, declared, required)
        elif key == "required" and isinstance(value, list):
            required.extend(value)
        elif key == "dependentRequired" and isinstance(value, dict):
            required.extend(name for names in value.values() for name in names)
        elif key in ("const", "enum"):
            declared.extend(_object_keys(value))
        elif key not in ("default", "examples"):
            _collect_names(value, declared, required)


def _object_keys(data: Any) -> list[str]:
    """The keys of every object inside a JSON value, depth first."""
    if isinstance(data, list):
        return [k for item in data for k in _object_keys(item)]
    if isinstance(data, dict):
        return [k for key, value in data.items() for k in (key, *_object_keys(value))]
    return []


def in_written_form(data: Any, order: dict[str, tuple[int, int]]) -> bool:
    """The grammar could write `data` as `compact(data)` (the module docstring's rule)."""
    if isinstance(data, float):
        return not data.is_integer()
    if isinstance(data, list):
        return all(in_written_form(item, order) for item in data)
    if isinstance(data, dict):
        ranks = [order.get(key, (2, 0)) for key in data]
        return ranks == sorted(ranks) and all(in_written_form(v, order) for v in data.values())
    return True


GROUPS = _load_groups()
LOCAL_GROUPS = [g for g in GROUPS if all(r.startswith("#") for r in refs(g.schema))]


def in_scope_tests(group: Group) -> list[dict[str, Any]]:
    order = key_order(group.schema)
    return [t for t in group.tests if not t["valid"] or in_written_form(t["data"], order)]


@functools.cache
def compiled(group_idx: int) -> stemma.Constraint | str:
    """LOCAL_GROUPS[group_idx]'s schema compiled, or stemma's refusal."""
    try:
        return stemma.Constraint(json_schema=LOCAL_GROUPS[group_idx].schema, backend="llguidance")
    except ValueError as err:
        return str(err)


def misdecided(group_idx: int) -> list[str]:
    """Descriptions of the group's in-scope tests stemma decides wrong (none when refused)."""
    constraint = compiled(group_idx)
    if isinstance(constraint, str):
        return []
    tests = in_scope_tests(LOCAL_GROUPS[group_idx])
    return [t["description"] for t in tests if constraint.accepts(compact(t["data"])) != t["valid"]]


@pytest.mark.parametrize(
    "group_idx",
    range(len(LOCAL_GROUPS)),
    ids=[f"{g.file}:{g.description}" for g in LOCAL_GROUPS],
)
def test_compiled_schema_decides_every_in_scope_instance(group_idx: int) -> None:
    group = LOCAL_GROUPS[group_idx]
    known = [t for f, g, t in KNOWN_WRONG if (f, g) == (group.file, group.description)]
    assert sorted(misdecided(group_idx)) == sorted(known)


def test_enough_groups_compile_and_enough_instances_are_checked() -> None:
    ok_idx = [i for i in range(len(LOCAL_GROUPS)) if not isinstance(compiled(i), str)]
    assert len(ok_idx) >= MIN_COMPILED_GROUPS
    assert sum(len(in_scope_tests(LOCAL_GROUPS[i])) for i in ok_idx) >= MIN_CHECKED_INSTANCES


def test_known_wrong_names_in_scope_instances() -> None:
    in_scope = {
        (g.file, g.description, t["description"]) for g in LOCAL_GROUPS for t in in_scope_tests(g)
    }
    assert set(KNOWN_WRONG) <= in_scope


def test_suite_cases_are_named_uniquely() -> None:
    """KNOWN_WRONG's keys find one case each."""
    keys = [(g.file, g.description, t["description"]) for g in GROUPS for t in g.tests]
    assert len(keys) == len(set(keys))


def test_scope_rule_keeps_written_forms_only() -> None:
    schema = {"properties": {"b": {}, "a": {"const": {"y": 1, "x": 2}}}, "required": ["c"]}
    order = key_order(schema)
    assert order == {"b": (0, 0), "a": (0, 1), "y": (0, 2), "x": (0, 3), "c": (1, 0)}
    assert in_written_form({"b": 1, "a": {"y": 1, "x": 2}, "c": 0, "z": 0, "w": 0}, order)
    assert not in_written_form({"a": 1, "b": 2}, order)
    assert not in_written_form({"z": 0, "c": 1}, order)
    assert not in_written_form({"b": [{"x": 1, "y": 2}]}, order)
    assert not in_written_form([1.0], order)
    assert in_written_form([1, 1.5, 1e-05, True], order)


def test_scope_rule_keeps_every_invalid_instance() -> None:
    tests = [
        {"description": "valid, keys out of order", "data": {"a": 1, "b": 2}, "valid": True},
        {"description": "invalid, keys out of order", "data": {"a": 1, "b": 2}, "valid": False},
        {"description": "valid, 1.0", "data": 1.0, "valid": True},
        {"description": "valid, in order", "data": {"b": 2, "a": 1}, "valid": True},
    ]
    group = Group("x.json", "g", {"properties": {"b": {}, "a": {}}}, tests)
    kept = [t["description"] for t in in_scope_tests(group)]
    assert kept == ["invalid, keys out of order", "valid, in order"]
