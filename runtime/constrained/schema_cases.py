"""Conditionals that test one key's value, rewritten as one split into cases.

An `allOf` of n members `if {"properties": {k: {"const": v}}} then A else B`, rewritten one by
one, is n two-way alternatives that llguidance multiplies out: 2^n objects (six such members
of one schema compiled in 126 ms, each more doubling it). Which branch each member takes
depends only on the object's key `k`, so its instances fall into a few cases, each taking
exactly the branches that apply there: a non-object (every test passes vacuously), an object
without `k`, `k` with a value in each class of values the tests treat alike, `k` with any
other value: at most three cases more than the values the tests name (n + 3 where each names
one), which accept the same instances. Where the schema holding the `allOf` requires `k`, is
an object only, or lists `k`'s values (`enum`), the cases it rules out are left out and "any
other value" is the listed ones left over.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from .schema_logic import ASSERTIONS, JSON_TYPES, SchemaLogic, json_equal

_TEST_KEYS = frozenset({"properties", "required"})  # what a test may assert
_MEMBER_KEYS = frozenset({"if", "then", "else"})  # what a member may assert


class _Test(NamedTuple):
    """One member: `then` where `k`'s value is one of `values` (or `k` is absent and the
    test does not require it), else `other`."""

    values: list[Any]
    needs_key: bool
    then: Any
    other: Any


def split_cases(
    logic: SchemaLogic, holder: dict[str, Any], members: list[Any], rewrite: Callable
) -> list[Any] | None:
    """`members` (the `allOf` of `holder`) with its tests of one key's value as one member
    `anyOf` of cases; None where fewer than two members test the same key.
    rewrite(schema, i, keyword) rewrites member i's `then` / `else` as at its own path."""
    found: dict[str, list[int]] = {}
    for i, member in enumerate(members):
        if (key := _tested_key(member)) is not None:
            found.setdefault(key, []).append(i)
    if not found:
        return None
    key, indices = max(found.items(), key=lambda item: len(item[1]))
    if len(indices) < 2:
        return None
    tests = [_test(members[i], key) for i in indices]
    classes = _classes(tests)
    listed = logic.key_values(holder, key)
    if (rest := _rest(logic, listed, classes)) is None:
        return None
    tests = [
        t._replace(then=rewrite(t.then, i, "then"), other=rewrite(t.other, i, "else"))
        for i, t in zip(indices, tests)
    ]
    cases = _cases(logic, holder, key, tests, classes, listed, rest)
    kept = [rewrite(m, i, None) for i, m in enumerate(members) if i not in indices]
    return [*kept, {"anyOf": cases}]


def _tested_key(member: Any) -> str | None:
    """The key whose value alone decides member's `if`, where that is all it holds."""
    if not isinstance(member, dict) or "if" not in member:
        return None
    if any(k in ASSERTIONS and k not in _MEMBER_KEYS for k in member):
        return None
    test = member["if"]
    if not isinstance(test, dict) or any(k in ASSERTIONS and k not in _TEST_KEYS for k in test):
        return None
    props, required = test.get("properties"), test.get("required", [])
    if not (isinstance(props, dict) and len(props) == 1):
        return None
    [(key, sub)] = props.items()
    if required not in ([], [key]) or _listed(sub) is None:
        return None
    return key


def _listed(s: Any) -> list[Any] | None:
    """The values `s` allows, where it asserts nothing but a `const` or an `enum`."""
    if not isinstance(s, dict) or any(k in ASSERTIONS and k not in ("const", "enum") for k in s):
        return None
    if "const" in s:
        return [s["const"]] if "enum" not in s else None
    return s["enum"] if isinstance(s.get("enum"), list) else None


def _test(member: dict[str, Any], key: str) -> _Test:
    test = member["if"]
    values = _listed(test["properties"][key])
    assert values is not None
    needs_key = key in test.get("required", [])
    return _Test(values, needs_key, member.get("then", True), member.get("else", True))


def _classes(tests: list[_Test]) -> list[tuple[list[Any], tuple[bool, ...]]]:
    """The tested values in classes of those every test treats alike: (values, which
    tests they pass)."""
    classes: list[tuple[list[Any], tuple[bool, ...]]] = []
    for value in [v for t in tests for v in t.values]:
        taken = tuple(any(json_equal(value, v) for v in t.values) for t in tests)
        same = next((c for c in classes if c[1] == taken), None)
        if same is None:
            classes.append(([value], taken))
        elif not any(json_equal(value, v) for v in same[0]):
            same[0].append(value)
    return classes


def _rest(logic: SchemaLogic, listed: list[Any] | None, classes: list[Any]) -> Any:
    """The key's values no test names (False: none is left): the holder's listed ones left
    over, else the complement of the tested ones; None where that is no schema (an object
    or an array among them)."""
    tested = [v for values, _ in classes for v in values]
    if listed is None:
        return logic.negate({"enum": tested}, 0)
    rest = [v for v in listed if not any(json_equal(v, w) for w in tested)]
    return {"enum": rest} if rest else False


def _cases(
    logic: SchemaLogic,
    holder: dict[str, Any],
    key: str,
    tests: list[_Test],
    classes: list[tuple[list[Any], tuple[bool, ...]]],
    listed: list[Any] | None,
    rest: Any,
) -> list[Any]:
    """The cases, each with the branches it takes, less those the holder rules out."""
    cases = []
    if logic.types(holder, 0) - {"object"}:  # every test passes vacuously
        others = sorted(JSON_TYPES - {"object"})
        cases.append(_case({"type": others}, [t.then for t in tests]))
    required = holder.get("required")
    if not (isinstance(required, list) and key in required):  # absent: a test that does not
        absent = {"type": "object", "properties": {key: False}}  # require the key passes
        cases.append(_case(absent, [t.other if t.needs_key else t.then for t in tests]))
    for values, taken in classes:
        if listed is not None:  # values the holder refuses need no case
            values = [v for v in values if any(json_equal(v, w) for w in listed)]
        if values:
            test = {"type": "object", "required": [key], "properties": {key: {"enum": values}}}
            cases.append(_case(test, [t.then if on else t.other for t, on in zip(tests, taken)]))
    if rest is not False:
        test = {"type": "object", "required": [key], "properties": {key: rest}}
        cases.append(_case(test, [t.other for t in tests]))
    return [c for c in cases if c is not None]


def _case(test: dict[str, Any], branches: list[Any]) -> dict[str, Any] | None:
    """`test` and every branch that asserts something; None where a branch is false."""
    if any(b is False for b in branches):
        return None
    taken = [b for b in branches if b is not True and b != {}]
    return {"allOf": [test, *taken]} if taken else test
