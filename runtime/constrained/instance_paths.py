"""Instance paths and the values on them: a path's steps as patterns (`Step`, `matches`),
the conditions a subschema applies at a path under (`Condition`: a key, or a key's value, of
an object on the way), and JSON values compared as JSON Schema compares them (`canonical`).
"""

from __future__ import annotations

from typing import Any

from .ecma_regex import ecma_regex

# One step of an instance path: ("key", name), ("pattern", p) for any key the pattern p
# matches, ("other", (names, patterns)) for any key not in names and matched by none of the
# patterns, ("index", i), or ("item", start) for any index >= start.
Step = tuple[str, Any]
# (depth, key, values): the object at the path's first `depth` steps has `key`, with one of
# these values (canonical(); None: any value); a path with its conditions (all must hold)
Condition = tuple[int, str, "frozenset[Any] | None"]
Placement = tuple[tuple[Step, ...], tuple[Condition, ...]]


def needed(path: tuple[Step, ...], depth: int, kind: str) -> str:
    """The type an instance at `path`'s first `depth` steps has for the path to go on."""
    if depth == len(path):
        return kind
    return "array" if path[depth][0] in ("index", "item") else "object"


def subschemas_at(s: dict[str, Any], kind: str, arg: Any) -> list[Any]:
    """The subschemas of `s` that the value one step (`kind`, `arg`) inside applies (those
    that a step standing for many keys or indices may pass under: none)."""
    if kind == "key":
        props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
        patterns = s.get("patternProperties")
        patterns = patterns if isinstance(patterns, dict) else {}
        if any(ecma_regex(p) is None for p in patterns):
            return []
        out = [sub for p, sub in patterns.items() if searches(p, arg)]
        if arg in props:
            return [props[arg], *out]
        return out or [s.get("additionalProperties", True)]
    if kind in ("index", "item"):
        prefix = list_of(s, "prefixItems") or list_of(s, "items")
        if arg < len(prefix):
            return [prefix[arg]] if kind == "index" else []
        return [s.get("additionalItems" if isinstance(s.get("items"), list) else "items", True)]
    return []


def list_of(s: dict[str, Any], key: str) -> list[Any]:
    return s[key] if isinstance(s.get(key), list) else []


def matches(pattern: tuple[Step, ...], path: list[Any]) -> bool:
    if len(pattern) != len(path):
        return False
    for (kind, arg), at in zip(pattern, path):
        is_key = isinstance(at, str)
        if kind == "key" and not (is_key and at == arg):
            return False
        if kind == "pattern" and not (is_key and searches(arg, at)):
            return False
        if kind == "other" and not (
            is_key and at not in arg[0] and not any(searches(p, at) for p in arg[1])
        ):
            return False
        if kind == "index" and not (not is_key and at == arg):
            return False
        if kind == "item" and not (not is_key and at >= arg):
            return False
    return True


def searches(pattern: str, key: str) -> bool:
    """The key matches the `patternProperties` pattern (read as ECMA-262 reads it)."""
    compiled = ecma_regex(pattern)
    return compiled is not None and compiled.search(key) is not None


def canonical(value: Any) -> Any:
    """A hashable form equal exactly where JSON Schema calls two values equal (1 == 1.0,
    true != 1, objects regardless of key order)."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, (int, float)):
        return ("number", int(value) if float(value).is_integer() else value)
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, list):
        return ("array", tuple(canonical(v) for v in value))
    return ("object", frozenset((k, canonical(v)) for k, v in value.items()))
