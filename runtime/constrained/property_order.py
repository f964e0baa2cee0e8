"""Object keys in any order (`property_order="any"`, llguidance backend). The grammar emits an
object's `properties` in the schema's order; JSON Schema lets keys come in any order. Here every
object's listed properties become exact-name `patternProperties` (anchored, escaped: the same
instances pass), which the grammar takes in any order, and what order used to say is enforced
beside the grammar by the scanner of unique_matcher.py: in every object each key at most once,
and, where the object's keywords apply at fixed instance paths (`KeyRule`), no closing brace
while a `required` key is missing, min/maxProperties counted as before.

A `required` moves beside the grammar only where it applies to every object at some instance
path (the walk of schema_paths.py: through `properties`, `patternProperties`,
`additionalProperties`, `items`, `allOf`, local `$ref`s and an `anyOf` / `oneOf` branch that is
the only one whose value there can be an object, or through every branch that admits them: the
same definition under each). It also moves where a discriminator chooses the branch (a key every
object there has, required by the `anyOf`'s holder or by each branch, whose `const` / `enum`
values no two branches share; or, where every branch that admits objects requires a key all the
others forbid, which of those keys is there, with a rule of its own that one is): there it is
checked once that key or value is known, at the closing brace, or, where an inner object closed
first, at that key or value's end (json_scanner.py). Elsewhere (under `not`, `if`, a pattern not
read as ECMA-262 reads it or an ambiguous branch, or under the target of a recursive `$ref`:
a root that refers to itself is unrolled once first, so its own level is not) it stays in the
grammar, and so does the schema's order of that object's properties, and of those
of every subschema joined with it (`allOf` / `anyOf` / `oneOf` members, `$ref` targets):
llguidance emits an object's listed properties before its patterned ones, and required patterned
keys first, so a mix would refuse the schema's own order. An object with its own
`patternProperties` that match a listed name (llguidance refuses overlapping patterns) or with
`unevaluatedProperties`, or with a name that JSON writes with an escape, keeps its listed
properties in the schema's order too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...lang.sampling_table import PROPERTY_ORDERS
from .ecma_regex import ecma_regex
from .instance_paths import Condition, Step, matches
from .key_presence import disjunction_formula
from .schema_logic import (
    DATA_KEYWORDS,
    as_list,
    asserted,
    combinators_ahead,
    pointer,
)
from .schema_paths import exact_nodes
from .schema_refs import max_chars_of, unrolled_root

# Keywords whose values map names (not keywords) to subschemas.
_NAME_MAPS = frozenset(
    "properties patternProperties $defs definitions dependentSchemas dependencies".split()
)
_DISJUNCTIONS = frozenset({"anyOf", "oneOf"})
_META = re.compile(r"([\\.+*?()|\[\]{}^$])")
_ESCAPED = re.compile(r'["\\\x00-\x1f]')  # what JSON writes escaped in a string


def check_property_order(value: Any) -> str:
    if value not in PROPERTY_ORDERS:
        raise ValueError(f"property_order must be one of {PROPERTY_ORDERS}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class KeyRule:
    """What the keys of every object at some instance paths must satisfy."""

    required: frozenset[str] = frozenset()
    min_count: int = 0
    max_count: int | None = None
    names: frozenset[str] | None = None  # the only keys allowed (a closed object), if any
    formula: Any = None  # which keys are there, as key_presence.py says it, if anything

    def merge(self, other: KeyRule) -> KeyRule:
        """Both rules at once (two subschemas applying at one path, through an `allOf`)."""
        highs = [m for m in (self.max_count, other.max_count) if m is not None]
        names = [n for n in (self.names, other.names) if n is not None]
        formulas = tuple(f for f in (self.formula, other.formula) if f is not None)
        return KeyRule(
            self.required | other.required,
            max(self.min_count, other.min_count),
            min(highs) if highs else None,
            frozenset.intersection(*names) if names else None,
            ("all", formulas) if len(formulas) > 1 else formulas[0] if formulas else None,
        )


# (conditions, required keys, key_presence.py formula or None): a conditional rule
Check = tuple[tuple[Condition, ...], frozenset[str], Any]


@dataclass(frozen=True, slots=True)
class ObjectKeys:
    """The key rules by instance path (steps as instance_paths.py's); every other object's
    keys are only kept unique. A `conditional` rule is the `required` of a subschema that
    applies at its path where a discriminator chooses it: for each condition, the object at
    the path's first `depth` steps has the key (with one of the values, where they are
    given); or, where branches are chosen by which key is there, that one of them is."""

    rules: tuple[tuple[tuple[Step, ...], KeyRule], ...] = ()
    conditional: tuple[
        tuple[tuple[Step, ...], tuple[Condition, ...], frozenset[str], Any], ...
    ] = ()

    def at(self, path: list[Any]) -> KeyRule:
        found = KeyRule()
        for pattern, rule in self.rules:
            if matches(pattern, path):
                found = found.merge(rule)
        return found

    def conditional_at(self, path: list[Any]) -> tuple[Check, ...]:
        """The conditional rules of the object at `path`."""
        return tuple((c, r, f) for pattern, c, r, f in self.conditional if matches(pattern, path))

    def watched_at(self, path: list[Any]) -> frozenset[str]:
        """The keys of the object at `path` whose values some condition reads."""
        return frozenset(
            key
            for pattern, conditions, _, _ in self.conditional
            for depth, key, values in conditions
            if values is not None and depth == len(path) and matches(pattern[:depth], path)
        )


def any_order(schema: Any) -> tuple[Any, ObjectKeys] | None:
    """(`schema` with its objects' properties as patterns and the exactly placed ones'
    `required` left out, the key rules), or None where no object changes. A root that
    refers to itself is unrolled once first (schema_refs.unrolled_root), so that its own
    objects, reached at fixed paths, keep their keys in any order."""
    if not isinstance(schema, dict):
        return None
    if (unrolled := unrolled_root(schema, max_chars_of(schema))) is not None:
        schema = unrolled
    formulas: dict[int, Any] = {}

    def formula(s: dict[str, Any]) -> Any:
        if id(s) not in formulas:
            formulas[id(s)] = disjunction_formula(schema, s)
        return formulas[id(s)]

    also: list[Any] = []  # "one of these keys is there", where such keys choose a branch
    exact = exact_nodes(
        schema,
        lambda s: _has_rule(s) or formula(s) is not None,
        "object",
        discriminate=True,
        aside=lambda s: formula(s) is not None,
        also=also,
    )
    # where its anyOf / oneOf say only which keys are there, and it holds at fixed paths
    dropped = frozenset(
        i for i in exact if formulas.get(i) is not None and not any(c for _, c in exact[i][1])
    )
    placed = sorted(
        ((node, where) for node, placements in exact.values() for where in placements),
        key=lambda p: repr(p[1]),
    )
    rules = tuple(
        (path, _rule(node, formulas[id(node)] if id(node) in dropped else None))
        for node, (path, conditions) in placed
        if not conditions
    )
    conditional = tuple(
        (path, conditions, _rule(node).required, None)
        for node, (path, conditions) in placed
        if conditions and _has_required(node)
    ) + tuple((path, conditions, frozenset(), some) for path, conditions, some in also)
    ordered, alone = _ordered(schema, frozenset(exact), dropped)
    out = _copy(schema, frozenset(exact), ordered, alone, dropped)
    return None if out == schema else (out, ObjectKeys(rules, conditional))


def _has_rule(s: dict[str, Any]) -> bool:
    """`s` says something of an object's keys that order used to carry."""
    return _has_required(s) or _convertible(s)


def _convertible(s: dict[str, Any]) -> bool:
    """`s`'s listed properties can be exact-name patterns (see the module)."""
    props = s.get("properties")
    if not (isinstance(props, dict) and props) or not _apart(s.get("patternProperties"), props):
        return False
    return "unevaluatedProperties" not in s and all(_plain(name) for name in props)


def _apart(patterns: Any, names: dict[str, Any]) -> bool:
    """No pattern of the object's own `patternProperties` matches a listed name (so their
    exact-name patterns do not overlap them, which llguidance refuses); False where a
    pattern is not read as ECMA-262 reads it (`ecma_regex`)."""
    if patterns is None:
        return True
    if not isinstance(patterns, dict):
        return False
    compiled = [ecma_regex(p) for p in patterns]
    if None in compiled:
        return False
    return not any(p.search(name) for p in compiled for name in names)


def _plain(name: str) -> bool:
    """JSON writes `name` as it is (no escapes): its bytes so far are its prefix."""
    return _ESCAPED.search(name) is None


def _rule(s: dict[str, Any], formula: Any = None) -> KeyRule:
    props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
    low, high = s.get("minProperties"), s.get("maxProperties")
    # closed to its listed names; with patterns, the scanner cannot tell which keys they allow
    closed = s.get("additionalProperties") is False and not s.get("patternProperties")
    return KeyRule(
        frozenset(as_list(s.get("required"))),
        low if _is_int(low) else 0,
        high if _is_int(high) else None,
        frozenset(props) if closed else None,
        formula,
    )


def _exact(name: str) -> str:
    """A regex matching exactly the key `name`."""
    return "^" + _escaped(name) + "$"


def _escaped(name: str) -> str:
    return _META.sub(r"\\\1", name)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _ordered(
    schema: Any, targets: frozenset[int], dropped: frozenset[int]
) -> tuple[frozenset[int], frozenset[int]]:
    """The subschemas that keep their listed properties in the schema's order because one
    that applies to the same objects keeps its `required` in the grammar: llguidance emits an
    object's listed properties before its patterned ones, so converting some of them would
    refuse the schema's own order too. Subschemas apply to the same objects when one is the
    other's `allOf` / `anyOf` / `oneOf` member or `$ref` target (a definition used in several
    places joins them all: fewer objects in any order, never a valid order refused). Also
    the subschemas joined with no other (`alone`): only their names may share a pattern, as
    llguidance intersects joined objects pattern by pattern."""
    parent: dict[int, int] = {}

    def root(i: int) -> int:
        while parent.setdefault(i, i) != i:
            parent[i] = i = parent[parent[i]]
        return i

    nodes: dict[int, dict[str, Any]] = {}
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict) or id(node) in nodes:
            continue
        nodes[id(node)] = node
        combined = ("allOf",) if id(node) in dropped else ("allOf", "anyOf", "oneOf")
        joined = [m for key in combined for m in as_list(node.get(key))]
        if isinstance(node.get("$ref"), str):
            joined.append(pointer(schema, node["$ref"]))
        for other in joined:
            if isinstance(other, dict):
                parent[root(id(other))] = root(id(node))
        for key, value in node.items():
            if key in _NAME_MAPS and isinstance(value, dict):
                stack.extend(value.values())
            elif key not in DATA_KEYWORDS and (key in combined or key not in _DISJUNCTIONS):
                stack.append(value)
    keeping = {root(i) for i, node in nodes.items() if _has_required(node) and i not in targets}
    sizes: dict[int, int] = {}
    for i in nodes:
        sizes[root(i)] = sizes.get(root(i), 0) + 1
    ordered = frozenset(i for i in nodes if root(i) in keeping)
    return ordered, frozenset(i for i in nodes if sizes[root(i)] == 1)


def _has_required(s: dict[str, Any]) -> bool:
    """`s` requires some keys (a list of names)."""
    required = s.get("required")
    return (
        isinstance(required, list) and bool(required) and all(isinstance(k, str) for k in required)
    )


def _copy(
    node: Any,
    targets: frozenset[int],
    ordered: frozenset[int] = frozenset(),
    alone: frozenset[int] = frozenset(),
    dropped: frozenset[int] = frozenset(),
) -> Any:
    """A copy of `node` with each object's properties as exact-name patterns (but in the
    `ordered` subschemas; in the `alone` ones, names saying the same share one) and each
    target object's `required` left to the rule beside the grammar (min/maxProperties stay:
    llguidance counts keys whatever their patterns), and the `anyOf` / `oneOf` of the
    `dropped` ones too (their rules' formulas); every subschema with its combinators ahead
    (schema_logic.combinators_ahead), as llguidance needs them."""
    if isinstance(node, list):
        return [_copy(v, targets, ordered, alone, dropped) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in DATA_KEYWORDS:
            out[key] = value
        elif key in _DISJUNCTIONS and id(node) in dropped:
            continue
        elif key in _NAME_MAPS and isinstance(value, dict):  # names to subschemas
            out[key] = {
                name: _copy(sub, targets, ordered, alone, dropped) for name, sub in value.items()
            }
        else:
            out[key] = _copy(value, targets, ordered, alone, dropped)
    if id(node) in dropped:
        out["type"] = "object"  # as the disjunctions said (key_presence.py)
    if id(node) in targets:
        out.pop("required", None)
    if _convertible(node) and "required" not in out and id(node) not in ordered:
        props = out.pop("properties")
        names = (
            _name_patterns(props) if id(node) in alone else {_exact(n): v for n, v in props.items()}
        )
        out["patternProperties"] = {**names, **out.get("patternProperties", {})}
    return combinators_ahead(out)


def _name_patterns(props: dict[str, Any]) -> dict[str, Any]:
    """The listed properties as exact-name patterns, names whose subschemas assert the same
    sharing one (`^(?:a|b)$`): llguidance checks every two patterns of an object for
    overlap, a cost that grows with the square of their number."""
    groups: dict[str, list[str]] = {}
    firsts: dict[str, Any] = {}
    for name, sub in props.items():
        said = asserted(sub)
        groups.setdefault(said, []).append(name)
        firsts.setdefault(said, sub)
    out = {}
    for said, names in groups.items():
        body = (
            _exact(names[0])
            if len(names) == 1
            else "^(?:" + "|".join(_escaped(n) for n in names) + ")$"
        )
        out[body] = firsts[said]
    return out
