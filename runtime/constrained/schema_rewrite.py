"""Exact rewrites of the JSON-Schema keywords the llguidance backend cannot compile as written.

Each rewrite accepts exactly the instances the original accepts, or is not made (the keyword is
left in place and the backend refuses it by name):
- `dependencies` / `dependentRequired` / `dependentSchemas`: "k absent, or ..." as an `anyOf`;
- `not S`: the complement of S built keyword by keyword (`negate`); a keyword whose complement
  is not a schema (`pattern`, `items`, ...) leaves the `not` as it was;
- `oneOf`: `anyOf` when the branches are provably disjoint (types, a discriminating constant,
  a required key the other branch forbids), else "branch i and not the others";
- `if`/`then`/`else`: `anyOf [if ∧ then, ¬if ∧ else]`;
- `uniqueItems` where at most one item is allowed;
- `format` values llguidance does not know: JSON Schema makes an unknown format an annotation,
  which validators do not check; each one dropped is reported in the notes.
A rewrite that would grow the schema past a bound (`MAX_GROWTH`) is not made.
"""

from __future__ import annotations

import json
from typing import Any

from .schema_logic import ASSERTIONS, SchemaLogic, pointer_escape

# Keywords whose value is a subschema, a list of them, or a map of them.
_ONE = frozenset(
    "not if then else items additionalItems additionalProperties contains propertyNames "
    "unevaluatedItems unevaluatedProperties".split()
)
_MANY = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_MAP = frozenset("properties patternProperties $defs definitions dependentSchemas".split())
MAX_GROWTH = 16  # a rewritten schema may be at most this many times the original's size


def rewrite_schema(schema: Any, known_format: Any) -> tuple[Any, list[str]]:
    """(the rewritten schema, notes on what was dropped as an annotation).

    known_format(name) -> bool says which `format` values the backend checks."""
    rw = _Rewriter(schema, known_format)
    out = rw.node(schema, "#")
    if len(json.dumps(out)) > MAX_GROWTH * len(json.dumps(schema)) + 4096:
        return schema, []
    return out, rw.notes


class _Rewriter(SchemaLogic):
    def __init__(self, root: Any, known_format: Any) -> None:
        super().__init__(root)
        self.known_format = known_format
        self.notes: list[str] = []

    def node(self, s: Any, path: str) -> Any:
        """`s` with every subschema rewritten, then its own keywords."""
        if not isinstance(s, dict):
            return s
        out: dict[str, Any] = {}
        for key, value in s.items():
            if key in _ONE:
                out[key] = self.node(value, f"{path}/{key}")
                if key == "items" and isinstance(value, list):
                    out[key] = [self.node(v, f"{path}/items/{i}") for i, v in enumerate(value)]
            elif key in _MANY and isinstance(value, list):
                out[key] = [self.node(v, f"{path}/{key}/{i}") for i, v in enumerate(value)]
            elif key in _MAP and isinstance(value, dict):
                out[key] = {
                    k: self.node(v, f"{path}/{key}/{pointer_escape(k)}") for k, v in value.items()
                }
            elif key == "dependencies" and isinstance(value, dict):
                out[key] = {
                    k: v
                    if isinstance(v, list)
                    else self.node(v, f"{path}/{key}/{pointer_escape(k)}")
                    for k, v in value.items()
                }
            else:
                out[key] = value
        return self.own(out, path)

    def own(self, s: dict[str, Any], path: str) -> dict[str, Any]:
        extra: list[Any] = []
        fmt = s.get("format")
        if isinstance(fmt, str) and not self.known_format(fmt):
            self.notes.append(
                f"format {fmt!r} at {path} is not one the backend checks; as JSON Schema "
                "specifies for an unknown format, it is an annotation only"
            )
            s = _without(s, "format")
        for key in ("dependencies", "dependentRequired", "dependentSchemas"):
            if isinstance(s.get(key), dict):
                extra += [_dependency(k, d) for k, d in s[key].items()]
                s = _without(s, key)
        if "not" in s and (negated := self.negate(s["not"], 0)) is not None:
            extra.append(negated)
            s = _without(s, "not")
        if "if" in s and (conditional := self.conditional(s)) is not None:
            extra.append(conditional)
            s = _without(s, "if", "then", "else")
        if isinstance(s.get("oneOf"), list) and (exclusive := self.one_of(s["oneOf"])) is not None:
            extra.append(exclusive)
            s = _without(s, "oneOf")
        if s.get("uniqueItems") is True and _int(s.get("maxItems"), 2) <= 1:
            s = _without(s, "uniqueItems")
        if "$ref" in s and any(k in ASSERTIONS and k != "$ref" for k in s):
            # the same conjunction, which llguidance also takes when the $ref is recursive
            extra.insert(0, {"$ref": s["$ref"]})
            s = _without(s, "$ref")
        if extra:
            s = {**s, "allOf": [*s.get("allOf", []), *extra]}
        return s

    def conditional(self, s: dict[str, Any]) -> Any:
        negated = self.negate(s["if"], 0)
        if negated is None:
            return None
        then, other = s.get("then", True), s.get("else", True)
        return {"anyOf": [{"allOf": [s["if"], then]}, {"allOf": [negated, other]}]}

    def one_of(self, branches: list[Any]) -> Any:
        if all(self.disjoint(a, b) for i, a in enumerate(branches) for b in branches[i + 1 :]):
            return {"anyOf": branches}
        negations = [self.negate(b, 0) for b in branches]
        if any(n is None for n in negations):
            return None
        return {
            "anyOf": [
                {"allOf": [b, *(n for j, n in enumerate(negations) if j != i)]}
                for i, b in enumerate(branches)
            ]
        }


def _dependency(key: str, dependency: Any) -> Any:
    """`key` absent, or the dependency holds (property names or a subschema)."""
    then = {"required": dependency} if isinstance(dependency, list) else dependency
    return {"anyOf": [{"properties": {key: False}}, then]}


def _int(v: Any, default: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _without(s: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in s.items() if k not in keys}
