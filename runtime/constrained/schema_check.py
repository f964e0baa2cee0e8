"""What outlines-core would silently drop from a JSON schema, named up front.

outlines-core picks ONE branch per subschema, in this order: properties, allOf, anyOf, oneOf,
prefixItems, enum, const, $ref, type; every other keyword of that subschema is dropped.
`schema_issues` replays that dispatch and names each assertion keyword it would drop;
`rewrite_formats` swaps the formats whose outlines-core regexes can break JSON for safe ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .json_safe import can_match_unsafe
from .regex_check import scan_regex
from .schema_logic import DATA_KEYWORDS

_ANNOTATIONS = frozenset(
    "title description default examples $schema $id $comment $defs definitions $anchor "
    "readOnly writeOnly deprecated contentMediaType contentEncoding contentSchema discriminator "
    "nullable".split()
)
_ANY_TYPE = frozenset("type enum const allOf anyOf oneOf not if then else $ref".split())
_NUMERIC = frozenset("minimum maximum exclusiveMinimum exclusiveMaximum multipleOf format".split())
_DIGITS = frozenset(
    "minDigits maxDigits minDigitsInteger maxDigitsInteger minDigitsFraction maxDigitsFraction "
    "minDigitsExponent maxDigitsExponent".split()
)
_TYPE_KEYWORDS: dict[str, frozenset[str]] = {
    "string": frozenset("minLength maxLength pattern format".split()),
    "number": _NUMERIC | _DIGITS,
    "integer": _NUMERIC | _DIGITS,
    "object": frozenset(
        "properties required additionalProperties patternProperties propertyNames "
        "minProperties maxProperties dependentRequired dependentSchemas dependencies "
        "unevaluatedProperties".split()
    ),
    "array": frozenset(
        "items prefixItems minItems maxItems uniqueItems contains minContains maxContains "
        "additionalItems unevaluatedItems".split()
    ),
    "boolean": frozenset(),
    "null": frozenset(),
}
_ALL_KEYWORDS = _ANY_TYPE.union(*_TYPE_KEYWORDS.values())
# outlines-core's own email / uri regexes can emit '"' inside the JSON string; these cannot.
# Other formats (date, time, date-time, uuid) are honoured by shape only: 2023-02-31 passes.
_SAFE_FORMAT_PATTERNS = {
    "email": r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)*\.[a-zA-Z]{2,}",
    "uri": r"(https?|ftp)://[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}(:[0-9]{1,5})?(/[a-zA-Z0-9._~%!$&'()*+,;=:@-]*)*",
}


@dataclass(slots=True)
class _Branch:
    used: set[str]
    applicable: frozenset[str]
    children: list[tuple[str, Any]]


def rewrite_formats(node: Any) -> Any:
    """A copy of the schema with `format: email|uri` replaced by JSON-safe patterns."""
    if isinstance(node, list):
        return [rewrite_formats(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: v if k in DATA_KEYWORDS else rewrite_formats(v) for k, v in node.items()}
    fmt = out.get("format")
    if isinstance(fmt, str) and fmt in _SAFE_FORMAT_PATTERNS:
        if not {"pattern", "minLength", "maxLength"} & out.keys():
            out["pattern"] = _SAFE_FORMAT_PATTERNS[out.pop("format")]
    return out


def schema_issues(schema: dict[str, Any]) -> list[str]:
    """Every assertion outlines-core would drop from `schema`, as 'path: keyword (why)'."""
    issues: list[str] = []
    pending: list[tuple[str, Any]] = [("#", schema)]
    seen_refs: set[str] = set()
    while pending:
        path, node = pending.pop()
        if node is True or node == {}:
            continue
        if not isinstance(node, dict):
            issues.append(f"{path}: schema {node!r} (only object schemas are supported)")
            continue
        branch = _dispatch(node, path, schema, issues, seen_refs)
        for key in sorted((node.keys() - _ANNOTATIONS) & branch.applicable - branch.used):
            issues.append(f"{path}: {key}")
        pending.extend(reversed(branch.children))
    return issues


def _types(node: dict[str, Any]) -> list[str]:
    t = node.get("type", [])
    return [t] if isinstance(t, str) else list(t)


def _dispatch(
    node: dict[str, Any], path: str, root: dict[str, Any], issues: list[str], seen: set[str]
) -> _Branch:
    """Which keywords outlines-core's branch for `node` honours, and the subschemas it visits."""
    if "properties" in node:
        return _properties_branch(node, path, issues)
    for key in ("allOf", "anyOf", "oneOf"):
        if key in node:
            subs = node[key] if isinstance(node[key], list) else []
            if key == "allOf" and len(subs) != 1:
                issues.append(f"{path}: allOf with {len(subs)} subschemas (they get concatenated)")
            if key == "oneOf" and len(subs) > 1 and "discriminator" not in node:
                issues.append(f"{path}: oneOf (exclusivity is not enforced; decoded as anyOf)")
            kids = [(f"{path}/{key}/{i}", s) for i, s in enumerate(subs)]
            return _Branch({key}, _ALL_KEYWORDS, kids)
    if "prefixItems" in node:
        n = len(node["prefixItems"])
        used = {"prefixItems", "items", "additionalItems", "unevaluatedItems", "type"}
        used |= {"minItems"} if node.get("minItems", 0) <= n else set()
        used |= {"maxItems"} if node.get("maxItems", n) >= n else set()
        kids = [(f"{path}/prefixItems/{i}", s) for i, s in enumerate(node["prefixItems"])]
        return _Branch(used, _TYPE_KEYWORDS["array"] | _ANY_TYPE, kids)
    if "enum" in node or "const" in node:
        return _Branch({"enum", "const", "type"}, _ALL_KEYWORDS, [])
    if "$ref" in node:
        ref = node["$ref"]
        kids = []
        if isinstance(ref, str) and ref.startswith("#") and ref not in seen:
            seen.add(ref)
            kids = [(ref, _resolve_ref(root, ref))]
        return _Branch({"$ref"}, _ALL_KEYWORDS, kids)
    return _type_branch(node, path, issues)


def _properties_branch(node: dict[str, Any], path: str, issues: list[str]) -> _Branch:
    props = node["properties"] if isinstance(node["properties"], dict) else {}
    required = node.get("required", [])
    used = {"properties", "required", "additionalProperties", "unevaluatedProperties"}
    if "object" in _types(node):
        used.add("type")
    if missing := [r for r in required if r not in props]:
        issues.append(f"{path}: required {missing} not in properties (dropped)")
    if node.get("minProperties", 0) <= len(required):
        used.add("minProperties")
    if node.get("maxProperties", len(props)) >= len(props):
        used.add("maxProperties")
    kids = [(f"{path}/properties/{k}", v) for k, v in props.items()]
    return _Branch(used, _TYPE_KEYWORDS["object"] | _ANY_TYPE, kids)


def _type_branch(node: dict[str, Any], path: str, issues: list[str]) -> _Branch:
    types = [t for t in _types(node) if t in _TYPE_KEYWORDS]
    used, kids = {"type"}, []
    for t in types:
        if t == "string" and {"minLength", "maxLength"} & node.keys():
            used |= {"minLength", "maxLength"}
        elif t == "string" and "pattern" in node:
            used.add("pattern")
            _check_string_pattern(node["pattern"], path, issues)
        elif t == "string":
            used.add("format")
        elif t in ("number", "integer"):
            used |= _DIGITS
        elif t == "object":
            used |= {"additionalProperties", "minProperties"}
            if isinstance(node.get("additionalProperties"), dict):
                kids.append((f"{path}/additionalProperties", node["additionalProperties"]))
        elif t == "array":
            used |= {"items", "minItems", "maxItems"}
            if isinstance(node.get("items"), dict):
                kids.append((f"{path}/items", node["items"]))
    applicable = _ANY_TYPE.union(*(_TYPE_KEYWORDS[t] for t in types)) if types else _ALL_KEYWORDS
    return _Branch(used, applicable, kids)


def _resolve_ref(root: dict[str, Any], ref: str) -> Any:
    node: Any = root
    for part in ref.lstrip("#").split("/"):
        if part:
            node = node.get(part, {}) if isinstance(node, dict) else {}
    return node


def _check_string_pattern(pattern: Any, path: str, issues: list[str]) -> None:
    """A string `pattern` is pasted between quotes, so it must not match '"', '\\' or controls."""
    if not isinstance(pattern, str):
        issues.append(f"{path}: pattern {pattern!r} (not a string)")
        return
    body = pattern[1:-1] if pattern.startswith("^") and pattern.endswith("$") else pattern
    try:
        scan_regex(body)
        if can_match_unsafe(body):
            issues.append(
                f"{path}: pattern {pattern!r} can match '\"', '\\\\' or a control character, "
                "which outlines-core would emit unescaped (invalid JSON); exclude them"
            )
    except ValueError as err:
        issues.append(f"{path}: pattern {pattern!r}: {err}")
