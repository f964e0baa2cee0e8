"""Exact rewrites of the JSON-Schema keywords the llguidance backend cannot compile as written.

Each rewrite accepts exactly the instances the original accepts, or is not made (the keyword is
left in place and the backend refuses it by name):
- `dependencies` / `dependentRequired` / `dependentSchemas`: "k absent, or ..." as an `anyOf`;
- `not S`: the complement of S built keyword by keyword (`negate`); a keyword whose complement
  is not a schema (`pattern`, `items`, ...) leaves the `not` as it was;
- `oneOf`: `anyOf` when the branches are provably disjoint (types, a discriminating constant
  of a key both branches or the `oneOf`'s holder require, a required key the other branch
  forbids), else "branch i and not the others" (between two
  closed objects, "a key the other does not list" is "one of this branch's keys the other
  does not list", which a schema can say);
- `if`/`then`/`else`: `anyOf [if ∧ then, ¬if ∧ else]`; `then` / `else` without `if` are
  dropped (they assert nothing); an `allOf` of members testing one key's value, one split
  into cases (schema_cases.py: a case per class of values, not 2^n alternatives);
- `propertyNames` of strings, patterns, lengths and listed names: every key matched by a
  `patternProperties` or named in `properties` of a conjunct closed by
  `additionalProperties: false`;
- `uniqueItems: false` (it asserts nothing), and `uniqueItems` where at most one item is
  allowed; elsewhere, where it holds at fixed instance paths, it is left to the matcher
  beside the grammar (unique_items.py);
- a subschema whose instances come from a listed set (`enum` / `const`, its own or an `allOf`
  member's) next to any of the above: the listed values that pass it (schema_finite.py);
- what a subschema says twice (schema_redundant.py): a `type` its combinators imply, a
  pattern matching every key beside others, a listed property a matching pattern already
  says, a `required` name the enclosing schema already requires;
- `minProperties` / `maxProperties` that the required and the closed properties already imply,
  and "at least one" / "at most one" property said by naming which one is there;
- `format` values llguidance does not know: JSON Schema makes an unknown format an annotation,
  which validators do not check; each one dropped is reported in the notes.
A recursive `$ref` that llguidance would have to intersect is replaced by its target
(schema_refs.py). A rewrite that would grow the schema past a bound (`MAX_GROWTH`) is not
made. A node left with nothing to assert but one conjunct becomes that conjunct, not an
`allOf` of one: llguidance cannot intersect a recursive `$ref` with siblings, even empty ones.
"""

from __future__ import annotations

import functools
import json
from typing import Any, NamedTuple

from .schema_cases import split_cases
from .schema_finite import FiniteFolder, annotations
from .schema_logic import ASSERTIONS, SchemaLogic, as_list, pointer, pointer_escape, without
from .schema_redundant import (
    every_key_pattern,
    implied_type,
    patterned_properties,
    without_required,
)
from .schema_refs import TooLarge, inline_cyclic_refs, max_chars_of
from .unique_items import UniqueArrays, unique_arrays

# Keywords whose value is a subschema, a list of them, or a map of them.
_ONE = frozenset(
    "not if then else items additionalItems additionalProperties contains propertyNames "
    "unevaluatedItems unevaluatedProperties".split()
)
_MANY = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_MAP = frozenset("properties patternProperties $defs definitions dependentSchemas".split())
# What a propertyNames schema may assert and still be said by the keys' own keywords.
_NAME_KEYWORDS = frozenset({"type", "pattern", "minLength", "maxLength", "enum", "const"})
# Keywords llguidance refuses in some or all of their forms: a listed set beside one is folded.
_FOLDED_BESIDE = frozenset(
    "not oneOf if dependencies dependentRequired dependentSchemas uniqueItems propertyNames "
    "minProperties maxProperties allOf".split()
)
# Every keyword that `own` (or what it calls) reads: a subschema with none of them is kept as it
# is, without the walk through each rewrite (most of a large schema's subschemas).
_REWRITTEN = _FOLDED_BESIDE | frozenset("format then else $ref anyOf patternProperties".split())


class Rewrite(NamedTuple):
    """A rewritten schema, notes on what was dropped as an annotation, where its
    `uniqueItems` is left to the matcher beside the grammar (None: nowhere), and its JSON
    text (None where the rewrite was not made)."""

    schema: Any
    notes: list[str]
    unique: UniqueArrays | None = None
    text: str | None = None


def rewrite_schema(schema: Any, known_format: Any) -> Rewrite:
    """`schema` rewritten (the schema itself where nothing is, or a rewrite would pass the
    size bound). known_format(name) -> bool says which `format` values the backend checks.
    The bound is taken on the schema's JSON as json.dumps writes it, whatever text it came
    in, so a dict and its JSON text in any layout are rewritten alike."""
    text = json.dumps(schema)
    rw = _Rewriter(schema, known_format)
    max_chars = max_chars_of(schema, text)
    out = rw.node(schema, "#")
    try:  # no "$ref" in the text: no reference to inline
        out = inline_cyclic_refs(out, max_chars) if '"$ref"' in text else out
    except TooLarge:
        return Rewrite(schema, [])
    if len(out_text := json.dumps(out)) > max_chars:
        return Rewrite(schema, [])
    # walked only where a uniqueItems met needed it: none met, none left out of the grammar
    unique = rw._unique if rw._unique is not None and rw._unique.paths else None
    return Rewrite(out, rw.notes, unique, out_text)


class _Rewriter(SchemaLogic):
    def __init__(self, root: Any, known_format: Any) -> None:
        super().__init__(root)
        self.known_format = known_format
        self.finite = FiniteFolder(root)
        self._unique: UniqueArrays | None = None  # walked on the first uniqueItems met
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
                out[key] = self.members(s, key, value, path)
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
        return without_required(self.own(out, path))

    def members(self, s: dict[str, Any], key: str, value: list[Any], path: str) -> list[Any]:
        """`s[key]`'s members rewritten; an `allOf`'s tests of one key's value as one split
        into cases (schema_cases.py)."""

        def rewrite(sub: Any, i: int, keyword: str | None) -> Any:
            return self.node(sub, f"{path}/{key}/{i}" + (f"/{keyword}" if keyword else ""))

        if key == "allOf" and (split := split_cases(self, s, value, rewrite)) is not None:
            return split
        return [rewrite(v, i, None) for i, v in enumerate(value)]

    def own(self, s: dict[str, Any], path: str) -> dict[str, Any]:
        if _REWRITTEN.isdisjoint(s):
            return s
        if _FOLDED_BESIDE & set(s) and (folded := self.fold(s, path)) is not None:
            return folded
        extra: list[Any] = []
        fmt = s.get("format")
        if isinstance(fmt, str) and not self.known_format(fmt):
            self.notes.append(
                f"format {fmt!r} at {path} is not one the backend checks; as JSON Schema "
                "specifies for an unknown format, it is an annotation only"
            )
            s = without(s, "format")
        for key in ("dependencies", "dependentRequired", "dependentSchemas"):
            if isinstance(s.get(key), dict):
                extra += [_dependency(k, d) for k, d in s[key].items()]
                s = without(s, key)
        if "not" in s and (negated := self.negate(s["not"], 0)) is not None:
            extra.append(negated)
            s = without(s, "not")
        if "if" not in s and ("then" in s or "else" in s):
            s = without(s, "then", "else")
        if "propertyNames" in s and (names := self.property_names(s["propertyNames"])) is not None:
            extra += names
            s = without(s, "propertyNames")
        if "if" in s and (conditional := self.conditional(s)) is not None:
            extra.append(conditional)
            s = without(s, "if", "then", "else")
        one_of = s.get("oneOf")
        if isinstance(one_of, list) and (exclusive := self.one_of(one_of, s)) is not None:
            s = without(s, "oneOf")
            if "anyOf" in exclusive and "anyOf" not in s:
                s = {**s, "anyOf": exclusive["anyOf"]}  # in place: no allOf around recursive refs
            else:
                extra.append(exclusive)
        if s.get("uniqueItems") is False or (
            s.get("uniqueItems") is True
            and (
                _int(s.get("maxItems"), 2) <= 1
                or id(pointer(self.root, path)) in self.unique().node_ids
            )
        ):
            s = without(s, "uniqueItems")
        s, at_least_one = _property_counts(s)
        if at_least_one is not None:
            extra.append(at_least_one)
        s = patterned_properties(every_key_pattern(implied_type(self, s)))
        if "$ref" in s and any(k in ASSERTIONS and k != "$ref" for k in s):
            # the same conjunction, which llguidance also takes when the $ref is recursive
            extra.insert(0, {"$ref": s["$ref"]})
            s = without(s, "$ref")
        return _conjoin(s, extra)

    def unique(self) -> UniqueArrays:
        """Where the document's uniqueItems is enforced beside the grammar (one walk)."""
        if self._unique is None:
            self._unique = unique_arrays(self.root)
        return self._unique

    def fold(self, s: dict[str, Any], path: str) -> dict[str, Any] | None:
        """The subschema at `path` as written, as the listed values that pass it."""
        original = pointer(self.root, path)
        if not isinstance(original, dict):
            return None
        return self.finite.fold(original, annotations(s))

    def property_names(self, names: Any) -> list[Any] | None:
        """Conjuncts saying every key passes `names`; None where that is not said here."""
        names = self.resolve(names, 0)
        if names is True or names == {}:
            return []
        if names is False:
            return [{"maxProperties": 0}]
        if not isinstance(names, dict) or set(names) & ASSERTIONS - _NAME_KEYWORDS:
            return None
        if "type" in names and "string" not in as_list(names["type"]):
            return None
        out: list[Any] = []
        if isinstance(names.get("pattern"), str):
            out.append(
                {"patternProperties": {names["pattern"]: True}, "additionalProperties": False}
            )
        low, high = _int(names.get("minLength"), 0), _int(names.get("maxLength"), -1)
        if low > 0 or high >= 0:
            span = f"{low},{high}" if high >= 0 else f"{low},"
            length = f"^[\\s\\S]{{{span}}}$"
            out.append({"patternProperties": {length: True}, "additionalProperties": False})
        listed = [names["const"]] if "const" in names else names.get("enum")
        if isinstance(listed, list):
            keys = {k: True for k in listed if isinstance(k, str)}
            out.append({"properties": keys, "additionalProperties": False})
        return out

    def requiring(self, branch: Any, required: list[Any]) -> Any:
        """`branch` with these keys required as well, where that is said on the branch."""
        resolved = self.resolve(branch, 0)
        if not isinstance(resolved, dict):
            return resolved
        names = [*as_list(resolved.get("required")), *required]
        return {**resolved, "required": list(dict.fromkeys(n for n in names if isinstance(n, str)))}

    def conditional(self, s: dict[str, Any]) -> Any:
        negated = self.negate(s["if"], 0)
        if negated is None:
            return None
        then, other = s.get("then", True), s.get("else", True)
        return {"anyOf": [{"allOf": [s["if"], then]}, {"allOf": [negated, other]}]}

    def one_of(self, branches: list[Any], within: dict[str, Any]) -> Any:
        """The `oneOf` of `within` (the subschema it is in) as an `anyOf` or a conjunction."""
        if all(self.disjoint(a, b) for i, a in enumerate(branches) for b in branches[i + 1 :]):
            return {"anyOf": branches}
        if (required := as_list(within.get("required"))) and all(
            self.disjoint(*(self.requiring(c, required) for c in (a, b)))
            for i, a in enumerate(branches)
            for b in branches[i + 1 :]
        ):
            return {"anyOf": branches}  # disjoint where the keys `within` requires are there
        resolved = [self.resolve(b, 0) for b in branches]
        names = [_closed_names(r) for r in resolved]

        @functools.cache
        def negated(j: int, opened: bool) -> Any:
            """Branch j's complement; `opened`: of all but its `additionalProperties: false`."""
            return self.negate(
                without(resolved[j], "additionalProperties") if opened else branches[j], 0
            )

        def outside(j: int, i: int) -> Any:
            """The instances of branch i that fail branch j (None if no schema is built).
            Where both close their objects, a key j does not list is one of i's others, so
            "has a key j forbids" is "has one of those", which a schema can say."""
            if names[i] is None or names[j] is None:
                return negated(j, False)
            rest = negated(j, True)
            if rest is None:
                return None
            terms = [{"type": "object", "required": [k]} for k in names[i] if k not in names[j]]
            terms += [] if rest is False else [rest]
            return False if not terms else terms[0] if len(terms) == 1 else {"anyOf": terms}

        exclusive = []
        for i, b in enumerate(branches):
            others = [outside(j, i) for j in range(len(branches)) if j != i]
            if any(n is None for n in others):
                return None
            exclusive.append({"allOf": [b, *others]})
        return {"anyOf": exclusive}


def _closed_names(s: Any) -> list[str] | None:
    """The only keys an object matching `s` can have, where `s` closes its object to its
    listed properties; else None."""
    if not isinstance(s, dict) or s.get("additionalProperties") is not False:
        return None
    props = s.get("properties", {})
    return list(props) if isinstance(props, dict) and "patternProperties" not in s else None


def _conjoin(s: dict[str, Any], extra: list[Any]) -> dict[str, Any]:
    """`s` and every schema in `extra`: the one schema merged into `s` where `s` asserts
    nothing and their keys do not meet, else an `allOf`."""
    if not extra:
        return s
    if (
        len(extra) == 1
        and isinstance(extra[0], dict)
        and not any(k in ASSERTIONS for k in s)
        and not set(extra[0]) & set(s)
    ):
        return {**s, **extra[0]}
    return {**s, "allOf": [*s.get("allOf", []), *extra]}


def _property_counts(s: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """(`s` without the property counts llguidance cannot take, the schema that says them
    instead, or None). llguidance takes min/maxProperties only where every listed property
    is required; counts the other keywords imply are dropped, and "at least one" and "at most
    one" are said by naming which property is there."""
    props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
    required = {k for k in as_list(s.get("required")) if isinstance(k, str)}
    low, high = _int(s.get("minProperties"), -1), _int(s.get("maxProperties"), -1)
    closed = s.get("additionalProperties") is False and "patternProperties" not in s
    if 0 <= low <= len(required):
        s, low = without(s, "minProperties"), -1
    if high >= 0 and closed and len(props) <= high:
        s, high = without(s, "maxProperties"), -1
    if not props or required >= set(props) or (low < 0 and high < 0):
        return s, None
    none_named = {"properties": {k: False for k in props}, "minProperties": 1}
    if low == 1 and high < 0:  # a named property, or another one
        branches = [*({"required": [k]} for k in props), none_named]
    elif high == 1 and low <= 1:  # one named property and nothing else, or one other, or none
        only = [
            {"required": [k], "properties": {k: True}, "additionalProperties": False} for k in props
        ]
        branches = [*only, {**none_named, "maxProperties": 1}]
        branches += [{**none_named, "minProperties": 0, "maxProperties": 0}] if low <= 0 else []
    else:
        return s, None
    return without(s, "minProperties", "maxProperties"), {"anyOf": branches}


def _dependency(key: str, dependency: Any) -> Any:
    """`key` absent, or the dependency holds (property names or a subschema)."""
    then = {"required": dependency} if isinstance(dependency, list) else dependency
    return {"anyOf": [{"properties": {key: False}}, then]}


def _int(v: Any, default: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default
