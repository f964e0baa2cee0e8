"""Object keys in any order (`property_order="any"`, llguidance backend). The grammar emits an
object's `properties` in the schema's order; JSON Schema lets keys come in any order. Here an
object's listed properties become exact-name `patternProperties` (anchored, escaped), which the
grammar takes in any order, and what order used to say is enforced beside the grammar by the
scanner of unique_matcher.py (`KeyRule` at each instance path): each key at most once, no
closing brace while a `required` key is missing, and min/maxProperties counted as before.

That is exact only where the object's keywords apply to every object at some instance path
(the walk of unique_items.py: through `properties`, `additionalProperties`, `items`, `allOf`,
local `$ref`s and an `anyOf` / `oneOf` branch that is the only one admitting objects). An
object under `not`, `if`, a `patternProperties`, an ambiguous branch or in a recursive schema,
one with its own `patternProperties` (llguidance refuses overlapping patterns) or
`unevaluatedProperties`, or one with a name that JSON writes with an escape, keeps the
schema's order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .schema_logic import as_list
from .unique_items import Step, exact_nodes, matches

PROPERTY_ORDERS = ("schema", "any")
_META = re.compile(r"([\\.+*?()|\[\]{}^$])")


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

    def merge(self, other: KeyRule) -> KeyRule:
        """Both rules at once (two subschemas applying at one path, through an `allOf`)."""
        highs = [m for m in (self.max_count, other.max_count) if m is not None]
        names = [n for n in (self.names, other.names) if n is not None]
        return KeyRule(
            self.required | other.required,
            max(self.min_count, other.min_count),
            min(highs) if highs else None,
            frozenset.intersection(*names) if names else None,
        )


@dataclass(frozen=True, slots=True)
class ObjectKeys:
    """The key rules by instance path (steps as unique_items.py's)."""

    rules: tuple[tuple[tuple[Step, ...], KeyRule], ...] = ()

    def at(self, path: list[Any]) -> KeyRule | None:
        found = None
        for pattern, rule in self.rules:
            if matches(pattern, path):
                found = rule if found is None else found.merge(rule)
        return found


def any_order(schema: Any) -> tuple[Any, ObjectKeys] | None:
    """(`schema` with its exactly placed objects' properties as patterns, their key rules),
    or None where no object can be so rewritten."""
    if not isinstance(schema, dict):
        return None
    exact = exact_nodes(schema, _reorderable, "object")
    if not exact:
        return None
    rules = tuple(
        (path, _rule(node)) for node, paths in exact.values() for path in sorted(paths, key=repr)
    )
    return _copy(schema, frozenset(exact)), ObjectKeys(rules)


def _reorderable(s: dict[str, Any]) -> bool:
    props, required = s.get("properties"), s.get("required")
    has_props = isinstance(props, dict) and bool(props)
    has_required = isinstance(required, list) and bool(required)
    if not (has_props or has_required) or "patternProperties" in s:
        return False
    if "unevaluatedProperties" in s or not all(isinstance(k, str) for k in as_list(required)):
        return False
    names = [*(props if has_props else ()), *as_list(required)]
    return all(_plain(name) for name in names)


def _plain(name: str) -> bool:
    """JSON writes `name` as it is (no escapes): its bytes so far are its prefix."""
    return not any(c in '"\\' or ord(c) < 0x20 for c in name)


def _rule(s: dict[str, Any]) -> KeyRule:
    props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
    low, high = s.get("minProperties"), s.get("maxProperties")
    closed = s.get("additionalProperties") is False
    return KeyRule(
        frozenset(as_list(s.get("required"))),
        low if _is_int(low) else 0,
        high if _is_int(high) else None,
        frozenset(props) if closed else None,
    )


def _exact(name: str) -> str:
    """A regex matching exactly the key `name`."""
    return "^" + _META.sub(r"\\\1", name) + "$"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _copy(node: Any, targets: frozenset[int]) -> Any:
    """A copy of `node` with each target object's properties as exact-name patterns and its
    `required` left to the rule beside the grammar (min/maxProperties stay: llguidance counts
    keys whatever their patterns)."""
    if isinstance(node, list):
        return [_copy(v, targets) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _copy(v, targets) for k, v in node.items()}
    if id(node) in targets:
        props = out.pop("properties", None) or {}
        out.pop("required", None)
        if props:
            out["patternProperties"] = {_exact(name): v for name, v in props.items()}
    return out
