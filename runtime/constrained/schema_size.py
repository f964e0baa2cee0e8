"""How big a JSON schema gets before outlines-core builds its regex: nesting depth, and an
upper estimate of the regex's length.

outlines-core writes an array as `[(items)(,(items)){m,}]`, so each array level doubles its
items' regex; an object with optional properties repeats each one once per later property;
anyOf / oneOf / allOf / type lists add their branches; an untyped value, object or array is a
fixed generic pattern of a few thousand characters; `$ref` expands in place at most
`_MAX_REF_DEPTH` deep. `estimated_regex_chars` replays that structure in time linear in the
schema (memoized per node and ref depth), so a 500-byte schema 30 arrays deep is refused
by arithmetic, never by building its multi-gigabyte regex.
"""

from __future__ import annotations

import json
from typing import Any

from .schema_logic import DATA_KEYWORDS

_MAX_REF_DEPTH = 3  # outlines-core's max_recursion_depth: deeper refs fail to build anyway
_GENERIC = 14_000  # `{}` is 12955 characters; a bare object or array about 6400 (0.2.14)
_LEAF_BY_TYPE = {"string": 50, "number": 100, "integer": 50, "boolean": 12, "null": 4}
_FORMAT = 450  # longest format pattern: email's is 448 characters
_WRAP = 24  # brackets, commas, groups and quantifiers of one array or object
_GROUP = 4  # the parentheses around an alternation or a concatenation
_WS_SLOTS = 6  # whitespace patterns one composite inserts
MAX_COUNT = 1 << 32  # above Python's and Rust's largest regex repetition
_COUNT_KEYWORDS = frozenset(
    "minLength maxLength minItems maxItems minProperties maxProperties minDigits maxDigits "
    "minDigitsInteger maxDigitsInteger minDigitsFraction maxDigitsFraction minDigitsExponent "
    "maxDigitsExponent".split()
)


def json_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0), without recursion."""
    depth, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        depth = max(depth, level)
        stack.extend((child, level + 1) for child in children)
    return depth


def oversized_count(schema: Any) -> tuple[str, Any] | None:
    """The first count keyword (maxLength, minItems, ...) at or past MAX_COUNT, without
    recursion: outlines-core reads 2^64 and up as 0 (silently dropping the bound), and no
    regex engine repeats 2^32 times."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            for key, value in node.items():
                if key in _COUNT_KEYWORDS and isinstance(value, (int, float)):
                    if not value < MAX_COUNT:  # NaN too
                        return key, value
                elif key not in DATA_KEYWORDS:
                    stack.append(value)
    return None


def estimated_regex_chars(schema: Any, whitespace: str | None = None) -> int:
    """An upper estimate of len(build_regex_from_schema(schema)); call only on a schema
    whose depth is bounded (it recurses once per level)."""
    wrap = _WRAP + _WS_SLOTS * len(whitespace or "")
    return _Estimator(schema, wrap).size(schema, 0)


class _Estimator:
    def __init__(self, root: Any, wrap: int) -> None:
        self.root, self.wrap = root, wrap
        self.memo: dict[tuple[int, int], int] = {}

    def size(self, node: Any, ref_depth: int) -> int:
        key = (id(node), ref_depth)
        if key not in self.memo:
            self.memo[key] = self._size(node, ref_depth)
        return self.memo[key]

    def _size(self, node: Any, ref_depth: int) -> int:
        if not isinstance(node, dict) or not node.keys() - {"title", "description"}:
            return _GENERIC
        if isinstance(node.get("properties"), dict):
            return self._object(node, ref_depth)
        for key in ("allOf", "anyOf", "oneOf", "prefixItems"):
            if isinstance(node.get(key), list):
                return _GROUP + sum(self.size(s, ref_depth) + 1 for s in node[key])
        if "enum" in node or "const" in node:
            data = json.dumps([node.get("enum"), node.get("const")], ensure_ascii=False)
            return self.wrap + 2 * len(data)  # regex escapes at most double a character
        if isinstance(node.get("$ref"), str):
            if ref_depth >= _MAX_REF_DEPTH:
                return 0
            return self.size(_resolve(self.root, node["$ref"]), ref_depth + 1)
        types = node.get("type")
        types = [types] if isinstance(types, str) else types if isinstance(types, list) else []
        if not types:
            return _GENERIC
        return sum(self._typed(node, t, ref_depth) for t in types) + self.wrap

    def _object(self, node: dict[str, Any], ref_depth: int) -> int:
        props = node["properties"]
        names = sum(2 * len(json.dumps(k)) + self.wrap for k in props)
        values = sum(self.size(v, ref_depth) for v in props.values())
        required = node.get("required")
        num_optional = len(props) - (len(required) if isinstance(required, list) else 0)
        extra = node.get("additionalProperties")
        extra_size = 2 * self.size(extra, ref_depth) if isinstance(extra, dict) else 0
        # optional properties: each is repeated once per later one (see the module docstring)
        return max(num_optional, 1) * (names + values) + extra_size + self.wrap

    def _typed(self, node: dict[str, Any], type_name: Any, ref_depth: int) -> int:
        if type_name in ("array", "object"):  # items / values: `(x)(,(x)){m,n}`
            inner = node.get("items" if type_name == "array" else "additionalProperties")
            if not isinstance(inner, dict):
                return _GENERIC
            return 2 * self.size(inner, ref_depth) + self.wrap
        pattern, leaf = node.get("pattern"), _LEAF_BY_TYPE.get(type_name, _GENERIC)
        if isinstance(pattern, str):
            return leaf + len(pattern)
        return leaf + (_FORMAT if "format" in node else 0)


def _resolve(root: Any, ref: str) -> Any:
    """The subschema a local `#/...` ref names ({} where it names nothing)."""
    node = root
    for part in ref.lstrip("#").split("/"):
        if part:
            node = node.get(part, {}) if isinstance(node, dict) else {}
    return node
