"""What a schema says twice, left out so that llguidance need not intersect it (exact: the
same instances pass). llguidance cannot intersect subschemas around a recursive `$ref`, refuses
`patternProperties` that overlap, and keeps the schema's order of an object whose `required`
stays in its grammar; schema_rewrite.py applies these to every subschema it rewrites:
- `implied_type`: a `type` that the subschema's `$ref` / `allOf` / `anyOf` / `oneOf` imply;
- `every_key_pattern`: a `patternProperties` entry matching every key, beside others, as
  `additionalProperties` and a conjunct of each other entry and each listed property;
- `patterned_properties`: a listed property that a matching pattern already says;
- `without_required`: a `required` name inside a subschema that applies to the same instance
  as one already requiring it.
"""

from __future__ import annotations

from typing import Any

from .ecma_regex import ecma_regex
from .schema_logic import SchemaLogic, as_list, asserted, type_set, without

_COMBINED = frozenset({"$ref", "allOf", "anyOf", "oneOf"})


def implied_type(logic: SchemaLogic, s: dict[str, Any]) -> dict[str, Any]:
    """`s` without a `type` that its `$ref` / `anyOf` / `oneOf` / `allOf` already imply
    (every instance they admit has one of its types; `logic` reads the document)."""
    kinds = as_list(s.get("type"))
    if not kinds or not _COMBINED & set(s) or "integer" in kinds and "number" not in kinds:
        return s
    rest = without(s, "type")
    return rest if logic.types(rest, 0) <= type_set(kinds) else s


# Where a subschema applies to the same instance as the one holding it.
_SAME_INSTANCE = frozenset({"allOf", "anyOf", "oneOf", "not", "if", "then", "else"})


def without_required(s: Any) -> Any:
    """`s` with the names it requires left out of the `required` of the subschemas written
    inside it that apply to the same instance (`allOf`, `anyOf`, `oneOf`, `not`, `if`,
    `then`, `else`): an instance without one fails `s` whatever they say, and llguidance
    keeps the schema's order of an object whose `required` stays in its grammar."""
    if not isinstance(s, dict) or _SAME_INSTANCE.isdisjoint(s):
        return s
    names = frozenset(_strings(s.get("required")))
    return _without_names(s, names, top=True) if names else s


def _without_names(s: Any, names: frozenset[str], top: bool = False) -> Any:
    if not isinstance(s, dict):
        return s
    out = dict(s)
    if not top and "required" in s:
        kept = [k for k in as_list(s["required"]) if k not in names]
        out = {**without(out, "required"), **({"required": kept} if kept else {})}
    for key in _SAME_INSTANCE & set(s):
        value = s[key]
        if isinstance(value, list):
            out[key] = [_without_names(v, names) for v in value]
        else:
            out[key] = _without_names(value, names)
    return out if out != s else s


def _strings(value: Any) -> list[str]:
    return [v for v in as_list(value) if isinstance(v, str)] if isinstance(value, list) else []


_EVERY_KEY = frozenset({"", ".*", "^.*", ".*$"})  # patterns that match every key


def every_key_pattern(s: dict[str, Any]) -> dict[str, Any]:
    """`s` with a `patternProperties` entry that matches every key, beside others, said as
    `additionalProperties` and within each of the others and each listed property (a key
    passes every pattern it matches; llguidance refuses patterns that overlap)."""
    patterns = s.get("patternProperties")
    if not isinstance(patterns, dict) or len(patterns) < 2 or "unevaluatedProperties" in s:
        return s
    every = next((p for p in patterns if p in _EVERY_KEY), None)
    if every is None:
        return s
    common = patterns[every]

    def both(sub: Any) -> Any:
        return sub if asserted(common) == asserted(True) else {"allOf": [common, sub]}

    out = {**s, "patternProperties": {p: both(v) for p, v in patterns.items() if p != every}}
    if isinstance(s.get("properties"), dict):
        out["properties"] = {k: both(v) for k, v in s["properties"].items()}
    return {**out, "additionalProperties": common}


def patterned_properties(s: dict[str, Any]) -> dict[str, Any]:
    """`s` without the listed properties that a `patternProperties` entry matching the name
    already says (the same assertions, or the name's schema asserts nothing): a key must
    pass both, and llguidance would intersect them, which it cannot where a recursive `$ref`
    is under them. Patterns not read as ECMA-262 reads them (`ecma_regex`) are left alone."""
    props, patterns = s.get("properties"), s.get("patternProperties")
    if not (isinstance(props, dict) and isinstance(patterns, dict) and props and patterns):
        return s
    compiled = [(ecma_regex(p), asserted(sub)) for p, sub in patterns.items()]
    if any(pattern is None for pattern, _ in compiled):
        return s
    kept = {}
    for name, sub in props.items():
        said = [text for pattern, text in compiled if pattern.search(name)]
        if not said or asserted(sub) not in [*said, asserted(True)]:
            kept[name] = sub
    if len(kept) == len(props):
        return s
    return {**s, "properties": kept} if kept else without(s, "properties")
