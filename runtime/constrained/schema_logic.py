"""What a JSON schema can match, reasoned about without instances: the complement of a schema
built keyword by keyword, and whether two schemas can share an instance.

`SchemaLogic(root).negate(s)` is a schema matching exactly the instances `s` does not (None
where a keyword's complement is no schema: `pattern`, `items`, `multipleOf`, ...);
`disjoint(a, b)` is True only where no instance can match both. Keys outside JSON Schema's
assertion vocabulary are annotations and never fail an instance.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

# Keywords whose values are JSON data, not subschemas: a walk over a schema's subschemas skips them.
DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})

JSON_TYPES = frozenset({"null", "boolean", "object", "array", "number", "string"})
# Every keyword of JSON Schema (drafts 4 to 2020-12) that can fail an instance; any other key
# (title, description, default, a vendor's own) is an annotation and never fails one.
ASSERTIONS = frozenset(
    "type enum const multipleOf maximum exclusiveMaximum minimum exclusiveMinimum maxLength "
    "minLength pattern format items additionalItems prefixItems contains minContains "
    "maxContains maxItems minItems uniqueItems unevaluatedItems properties patternProperties "
    "additionalProperties unevaluatedProperties propertyNames maxProperties minProperties "
    "required dependencies dependentRequired dependentSchemas allOf anyOf oneOf not if then "
    "else $ref $dynamicRef $recursiveRef contentEncoding contentMediaType".split()
)
MAX_DEPTH = 8  # $ref hops and nested negations followed by one rewrite
_NUMERIC_BOUNDS = {
    "minimum": "exclusiveMaximum",
    "maximum": "exclusiveMinimum",
    "exclusiveMinimum": "maximum",
    "exclusiveMaximum": "minimum",
}
_LENGTHS = {"minLength": ("string", "maxLength"), "maxLength": ("string", "minLength")}
_LENGTHS |= {"minItems": ("array", "maxItems"), "maxItems": ("array", "minItems")}


class SchemaLogic:
    """Negation and disjointness within one schema document (local `$ref`s resolve in `root`)."""

    def __init__(self, root: Any) -> None:
        self.root = root

    def resolve(self, s: Any, depth: int) -> Any:
        """`s` with a local `$ref` (and nothing else that constrains) followed; None if not."""
        while isinstance(s, dict) and "$ref" in s and depth < MAX_DEPTH:
            if any(k in ASSERTIONS and k != "$ref" for k in s):
                return s
            s = pointer(self.root, s["$ref"])
            depth += 1
        return None if isinstance(s, dict) and "$ref" in s else s

    def key_values(self, s: Any, key: str) -> list[Any] | None:
        """The only values an object's `key` may have under `s` (its `properties` entry's
        `const` / `enum`, following local `$ref`s), where `s` lists them."""
        s = self.resolve(s, 0)
        props = s.get("properties") if isinstance(s, dict) else None
        sub = self.resolve(props.get(key), 0) if isinstance(props, dict) else None
        return _values(sub) if isinstance(sub, dict) else None

    def disjoint(self, a: Any, b: Any) -> bool:
        """No instance can match both `a` and `b` (False where it cannot be shown)."""
        a, b = self.resolve(a, 0), self.resolve(b, 0)
        if a is None or b is None:
            return False
        if not self.types(a, 0) & self.types(b, 0):
            return True
        if not (isinstance(a, dict) and isinstance(b, dict)):
            return a is False or b is False
        va, vb = _values(a), _values(b)
        if va is not None and vb is not None and not any(json_equal(x, y) for x in va for y in vb):
            return True
        return _discriminated(a, b) or _forbids_required(a, b) or _forbids_required(b, a)

    def types(self, s: Any, depth: int) -> frozenset[str]:
        """The JSON types an instance of `s` may have (a superset)."""
        if s is False:
            return frozenset()
        if not isinstance(s, dict) or depth > MAX_DEPTH:
            return JSON_TYPES
        out = JSON_TYPES
        if "$ref" in s:
            target = pointer(self.root, s["$ref"])
            out &= self.types(target, depth + 1) if target is not None else JSON_TYPES
        if "type" in s:
            out &= type_set(s["type"])
        if isinstance(s.get("enum"), list):
            out &= frozenset(_json_type(v) for v in s["enum"])
        if "const" in s:
            out &= {_json_type(s["const"])}
        for sub in s.get("allOf", []) if isinstance(s.get("allOf"), list) else []:
            out &= self.types(sub, depth + 1)
        for key in ("anyOf", "oneOf"):
            if isinstance(s.get(key), list):
                out &= frozenset().union(*(self.types(sub, depth + 1) for sub in s[key]))
        return out

    def negate(self, s: Any, depth: int) -> Any:
        """A schema matching exactly the instances `s` does not match; None if none is built."""
        if depth > MAX_DEPTH:
            return None
        if isinstance(s, bool):
            return not s
        if not isinstance(s, dict):
            return None
        terms: list[Any] = []
        for key, value in s.items():
            if key not in ASSERTIONS or key in ("then", "else") and "if" not in s:
                continue
            term = self.negate_keyword(s, key, value, depth)
            if term is None:
                return None
            if term is not False:
                terms.append(term)
        if not terms:
            return False
        return terms[0] if len(terms) == 1 else {"anyOf": terms}

    def negate_keyword(self, s: dict[str, Any], key: str, value: Any, depth: int) -> Any:
        """The instances failing this one keyword of `s` (False: none can)."""
        if key == "$ref":
            target = pointer(self.root, value)
            return None if target is None else self.negate(target, depth + 1)
        if key == "type":
            rest = _complement_types(value)
            return None if rest is None else ({"type": sorted(rest)} if rest else False)
        if key in ("enum", "const"):
            return _negate_values(value if key == "enum" else [value])
        if key == "required" and isinstance(value, list):
            absent = [{"type": "object", "properties": {k: False}} for k in value]
            return False if not absent else absent[0] if len(absent) == 1 else {"anyOf": absent}
        if key == "properties" and isinstance(value, dict):
            return self.negate_properties(value, depth)
        if key in _NUMERIC_BOUNDS and _is_number(value):
            return {"type": "number", _NUMERIC_BOUNDS[key]: value}
        if key in _LENGTHS and isinstance(value, int) and not isinstance(value, bool):
            kind, other = _LENGTHS[key]
            bound = value - 1 if key.startswith("min") else value + 1
            return False if bound < 0 else {"type": kind, other: bound}
        if key in ("anyOf", "allOf", "oneOf") and isinstance(value, list):
            return self.negate_combination(key, value, depth)
        if key == "not":
            return value
        return None

    def negate_properties(self, props: dict[str, Any], depth: int) -> Any:
        terms = []
        for name, sub in props.items():
            negated = self.negate(sub, depth + 1)
            if negated is None:
                return None
            if negated is not False:
                terms.append({"type": "object", "required": [name], "properties": {name: negated}})
        return False if not terms else terms[0] if len(terms) == 1 else {"anyOf": terms}

    def negate_combination(self, key: str, branches: list[Any], depth: int) -> Any:
        if key == "oneOf" and not all(
            self.disjoint(a, b) for i, a in enumerate(branches) for b in branches[i + 1 :]
        ):
            return None
        negations = [self.negate(b, depth + 1) for b in branches]
        if any(n is None for n in negations):
            return None
        if key == "allOf":  # fails one of them
            return {"anyOf": negations} if negations else False
        return {"allOf": negations} if negations else True  # fails every branch


def _discriminated(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Both require some key whose allowed constant values do not overlap."""
    for key in set(as_list(a.get("required"))) & set(as_list(b.get("required"))):
        va, vb = _constants(a, key), _constants(b, key)
        if va is not None and vb is not None and not any(json_equal(x, y) for x in va for y in vb):
            return True
    return False


def _forbids_required(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """`a` requires a key that `b` forbids."""
    return any(forbids(b, key) for key in as_list(a.get("required")))


def forbids(s: Any, key: str) -> bool:
    """No object passing `s` has `key` (a property that is false, or a closed object without
    patterns that does not list it)."""
    if not isinstance(s, dict):
        return s is False
    props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
    closed = s.get("additionalProperties") is False and "patternProperties" not in s
    return props.get(key) is False or (closed and key not in props)


def _constants(s: dict[str, Any], key: str) -> list[Any] | None:
    props = s.get("properties")
    sub = props.get(key) if isinstance(props, dict) else None
    return _values(sub) if isinstance(sub, dict) else None


def _values(s: dict[str, Any]) -> list[Any] | None:
    """The only values `s` allows, where `const` or `enum` lists them."""
    if "const" in s:
        return [s["const"]]
    return s["enum"] if isinstance(s.get("enum"), list) else None


def _negate_values(values: Any) -> Any:
    """Everything except these JSON values, where that is a schema (numbers as open ranges,
    strings as an anchored pattern over the trie of the excluded strings)."""
    if not isinstance(values, list):
        return None
    by_type: dict[str, list[Any]] = {}
    for v in values:
        by_type.setdefault(_json_type(v), []).append(v)
    if set(by_type) & {"object", "array"}:
        return None
    other_types = sorted(JSON_TYPES - set(by_type))
    terms: list[Any] = [{"type": other_types}] if other_types else []
    rest = [x for x in (True, False) if not any(x is v for v in by_type.get("boolean", []))]
    if "boolean" in by_type and rest:
        terms.append({"enum": rest})
    if "number" in by_type:
        points = sorted(set(by_type["number"]))
        terms.append({"type": "number", "exclusiveMaximum": points[0]})
        terms += [
            {"type": "number", "exclusiveMinimum": lo, "exclusiveMaximum": hi}
            for lo, hi in zip(points, points[1:])
            if lo != hi
        ]
        terms.append({"type": "number", "exclusiveMinimum": points[-1]})
    if "string" in by_type:
        terms.append({"type": "string", "pattern": f"^{_not_in_pattern(by_type['string'])}$"})
    return {"anyOf": terms} if len(terms) > 1 else terms[0] if terms else False


def _not_in_pattern(strings: list[str]) -> str:
    """A regex (unanchored body) for every string not in `strings`, read off their trie:
    stop where no excluded string ends, or leave the trie, or follow a branch."""
    trie: dict[str, Any] = {}
    for s in strings:
        node = trie
        for ch in s:
            node = node.setdefault(ch, {})
        node[""] = {}
    return _trie_complement(trie)


def _trie_complement(node: dict[str, Any]) -> str:
    children = sorted(k for k in node if k)
    options = [] if "" in node else ["()"]
    leave = "".join(_class_escape(c) for c in children)
    options.append(f"[^{leave}][\\s\\S]*" if leave else "[\\s\\S]+")
    options += [f"{re.escape(c)}{_trie_complement(node[c])}" for c in children]
    return "(" + "|".join(options) + ")"


def _class_escape(ch: str) -> str:
    return "\\" + ch if ch in "\\]^-[" else ch


def _complement_types(value: Any) -> frozenset[str] | None:
    named = type_set(value)
    if "integer" in as_list(value) and "number" not in as_list(value):
        return None  # the non-integer numbers are no JSON type
    return JSON_TYPES - named


def type_set(value: Any) -> frozenset[str]:
    names = set(as_list(value))
    if "integer" in names:
        names = (names - {"integer"}) | {"number"}
    return frozenset(names) & JSON_TYPES


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(v), "object")


def json_equal(a: Any, b: Any) -> bool:
    return _json_type(a) == _json_type(b) and a == b


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def as_list(v: Any) -> list[Any]:
    """A keyword value that may be one item or a list of them, as a list."""
    return v if isinstance(v, list) else [v] if v is not None else []


COMBINATORS = ("$ref", "allOf", "anyOf", "oneOf")


def combinators_ahead(s: dict[str, Any]) -> dict[str, Any]:
    """`s` with `$ref` / `allOf` / `anyOf` / `oneOf` first among its keys where it has
    `patternProperties` (the same schema: JSON objects are unordered). llguidance 1.9 reads
    such a subschema's keys in two parts around its first combinator, so an
    `additionalProperties: false` on one side of it refuses the keys that the
    `patternProperties` on the other side allow. `s` itself where nothing moves."""
    if "patternProperties" not in s or not any(k in s for k in COMBINATORS):
        return s
    first = {k: s[k] for k in COMBINATORS if k in s}
    return first | {k: v for k, v in s.items() if k not in first}


def without(s: dict[str, Any], *keys: str) -> dict[str, Any]:
    """`s` less `keys`."""
    return {k: v for k, v in s.items() if k not in keys}


def asserted(s: Any) -> str:
    """What `s` asserts, as comparable text (annotations left out; true and {} alike)."""
    if s is True or not isinstance(s, dict):
        s = {} if s is True else s
    else:
        s = {k: v for k, v in s.items() if k in ASSERTIONS}
    return json.dumps(s, sort_keys=True)


def pointer_escape(name: str) -> str:
    """A property name as one JSON-pointer segment (RFC 6901: ~ as ~0, / as ~1)."""
    return str(name).replace("~", "~0").replace("/", "~1")


@lru_cache(maxsize=64)
def _split_pointer(ref: str) -> tuple[str, ...] | None:
    if not ref.startswith("#"):
        return None
    body = ref[1:].lstrip("/")
    return tuple(p.replace("~1", "/").replace("~0", "~") for p in body.split("/")) if body else ()


def pointer(root: Any, ref: Any) -> Any:
    """The subschema a local `$ref` names; None for a remote or broken one."""
    parts = _split_pointer(ref) if isinstance(ref, str) else None
    if parts is None:
        return None
    node = root
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
