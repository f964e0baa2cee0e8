"""A request's output constraint, reduced to one validated regex in outlines-core's dialect.

Front doors: `regex`, `json_schema` (dict, JSON string or pydantic model class), `choices`,
`dtype`. Anything outlines-core would reject opaquely or silently mis-handle is reported by
name up front: unsupported regex features always raise ValueError; JSON-schema keywords that
outlines-core ignores raise too when `strict` (the default), or become warnings otherwise.
A leading `^` / trailing `$` is dropped (the whole output always has to match anyway).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

REGEX_INT = r"-?(0|[1-9][0-9]*)"
REGEX_FLOAT = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r'"([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"'
DTYPE_REGEX = {"int": REGEX_INT, "float": REGEX_FLOAT, "bool": REGEX_BOOL, "str": REGEX_STR}

# Rust regex-syntax's meta characters (regex::escape escapes exactly these).
_REGEX_META = frozenset("\\.+*?()|[]{}^$#&-~")
_GROUP_FEATURES = {
    "(?=": "lookahead",
    "(?!": "negative lookahead",
    "(?<=": "lookbehind",
    "(?<!": "negative lookbehind",
    "(?>": "atomic group",
    "(?P=": "backreference",
    "(?#": "inline comment",
}
_ESCAPE_FEATURES = {
    "b": r"word boundary \b",
    "B": r"word boundary \B",
    "<": r"word boundary \<",
    ">": r"word boundary \>",
    "A": r"anchor \A",
    "z": r"anchor \z",
    "Z": r"anchor \Z",
    "G": r"anchor \G",
    "k": "named backreference",
}


@dataclass(slots=True, frozen=True)
class ConstraintSpec:
    """Exactly one constraint, normalized so equal constraints have equal keys."""

    regex: str | None = None
    json_schema: str | None = None  # a JSON document; dicts / pydantic models are serialized
    choices: tuple[str, ...] | None = None
    dtype: str | None = None  # "int" | "float" | "bool" | "str"
    whitespace: str | None = None  # JSON whitespace pattern; None = compact (no whitespace)
    strict: bool = True  # False: ignored schema keywords become warnings instead of errors

    def __post_init__(self) -> None:
        given = [n for n in ("regex", "json_schema", "choices", "dtype") if getattr(self, n)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of regex/json_schema/choices/dtype, got {given}")
        if self.dtype is not None and self.dtype not in DTYPE_REGEX:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_REGEX)}, got {self.dtype!r}")

    @classmethod
    def create(
        cls,
        regex: str | None = None,
        json_schema: Any = None,
        choices: Any = None,
        dtype: Any = None,
        whitespace: str | None = None,
        strict: bool = True,
    ) -> ConstraintSpec:
        """Normalize the front-door arguments (schema objects to JSON, types to dtype names)."""
        if choices is not None:
            if isinstance(choices, str) or not all(isinstance(c, str) for c in choices):
                raise TypeError(f"choices must be a list of str, got {choices!r}")
            choices = tuple(choices)
        if isinstance(dtype, type):
            dtype = dtype.__name__
        schema = None if json_schema is None else schema_to_json(json_schema)
        return cls(regex, schema, choices, dtype, whitespace, strict)

    @property
    def key(self) -> str:
        fields = [self.regex, self.json_schema, self.choices, self.dtype, self.whitespace]
        blob = json.dumps([*fields, self.strict], ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]


@dataclass(slots=True)
class ResolvedConstraint:
    """The regex to compile, and what was loosened to get it (only when not strict)."""

    regex: str
    warnings: list[str] = field(default_factory=list)


def schema_to_json(schema: Any) -> str:
    """A JSON schema given as a dict, a JSON string or a pydantic model class, as JSON text."""
    if isinstance(schema, str):
        try:
            parsed = json.loads(schema)
        except json.JSONDecodeError as err:
            raise ValueError(f"json_schema is not valid JSON: {err}") from err
        if not isinstance(parsed, dict):
            raise ValueError(f"json_schema must be a JSON object, got {schema[:80]!r}")
        return schema
    if isinstance(schema, dict):
        return json.dumps(schema, ensure_ascii=False)
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return json.dumps(schema.model_json_schema(), ensure_ascii=False)
    raise TypeError(f"json_schema must be a dict, JSON string or pydantic model, got {schema!r}")


def escape_regex(text: str) -> str:
    """`text` as a regex matching exactly it."""
    return "".join("\\" + ch if ch in _REGEX_META else ch for ch in text)


def resolve(spec: ConstraintSpec) -> ResolvedConstraint:
    """The validated regex for `spec`; ValueError names whatever cannot be honoured."""
    if spec.regex is not None:
        return ResolvedConstraint(normalize_regex(spec.regex))
    if spec.choices is not None:
        return ResolvedConstraint("(" + "|".join(escape_regex(c) for c in spec.choices) + ")")
    if spec.dtype is not None:
        return ResolvedConstraint(DTYPE_REGEX[spec.dtype])
    from outlines_core.json_schema import build_regex_from_schema

    assert spec.json_schema is not None
    schema = rewrite_formats(json.loads(spec.json_schema))
    issues = schema_issues(schema)
    if issues and spec.strict:
        raise ValueError(
            "json_schema keywords outlines-core would silently ignore (strict=False accepts the "
            "looser constraint): " + "; ".join(issues)
        )
    whitespace = "" if spec.whitespace is None else spec.whitespace
    try:
        regex = build_regex_from_schema(json.dumps(schema, ensure_ascii=False), whitespace)
    except ValueError as err:
        raise ValueError(f"json_schema not supported by outlines-core: {err}") from err
    return ResolvedConstraint(normalize_regex(regex), [f"ignored: {i}" for i in issues])


def constraint_regex(
    regex: str | None = None,
    json_schema: Any = None,
    choices: Any = None,
    dtype: Any = None,
    whitespace: str | None = None,
) -> str:
    """The regex a request with this constraint is decoded under (strict validation)."""
    spec = ConstraintSpec.create(regex, json_schema, choices, dtype, whitespace)
    return resolve(spec).regex


def normalize_regex(regex: str) -> str:
    """Drop a leading ^ and trailing $; raise ValueError naming any unsupported feature."""
    if regex.startswith("^"):
        regex = regex[1:]
    if regex.endswith("$") and _num_backslashes_before(regex, len(regex) - 1) % 2 == 0:
        regex = regex[:-1]
    _scan_regex(regex)
    return regex


def _num_backslashes_before(text: str, idx: int) -> int:
    n = 0
    while idx - n - 1 >= 0 and text[idx - n - 1] == "\\":
        n += 1
    return n


def _unsupported(feature: str, regex: str, pos: int) -> ValueError:
    where = regex[max(0, pos - 10) : pos + 10]
    return ValueError(
        f"regex feature not supported by constrained decoding: {feature} at position {pos} "
        f"(near {where!r}); outlines-core builds a DFA, which has no lookaround, "
        "backreferences, anchors inside the pattern, or lazy/possessive quantifiers"
    )


def _scan_regex(regex: str) -> None:
    """Walk the pattern once, tracking escapes and (nested) classes, rejecting by name."""
    i, class_depth, after_quantifier = 0, 0, False
    while i < len(regex):
        ch = regex[i]
        if ch == "\\":
            nxt = regex[i + 1 : i + 2]
            if class_depth == 0 and (nxt in _ESCAPE_FEATURES or nxt.isdigit() and nxt != "0"):
                raise _unsupported(_ESCAPE_FEATURES.get(nxt, "backreference"), regex, i)
            i += 2
            if nxt in ("x", "u", "p", "P") and regex[i : i + 1] == "{":
                i = regex.find("}", i) + 1 or len(regex)
            after_quantifier = False
            continue
        if class_depth:
            if regex.startswith("[:", i):
                i = regex.find(":]", i) + 2 or len(regex)
                continue
            class_depth += {"[": 1, "]": -1}.get(ch, 0)
            i += 1
            continue
        if ch == "[":
            class_depth, i = 1, i + 1 + (regex[i + 1 : i + 2] == "^")
            i += regex[i : i + 1] == "]"  # a leading ] is a literal
            after_quantifier = False
            continue
        if ch == "(" and regex.startswith("(?", i):
            i = _scan_group_prefix(regex, i)
            after_quantifier = False
            continue
        if ch in "^$":
            raise _unsupported(f"anchor {ch}", regex, i)
        if ch in "*+?" and after_quantifier:
            raise _unsupported(
                "lazy quantifier" if ch == "?" else "possessive quantifier", regex, i
            )
        if ch == "{" and (end := regex.find("}", i)) > i:
            i, after_quantifier = end + 1, True
            continue
        after_quantifier = ch in "*+?"
        i += 1


def _scan_group_prefix(regex: str, i: int) -> int:
    """Index just past a `(?...` group prefix; raises for lookaround and friends."""
    for prefix, feature in _GROUP_FEATURES.items():
        if regex.startswith(prefix, i):
            raise _unsupported(feature, regex, i)
    j = i + 2
    while j < len(regex) and regex[j] not in ":)<P'":
        if regex[j] == "U":
            raise _unsupported("ungreedy flag (?U)", regex, i)
        j += 1
    return j + 1 if j < len(regex) and regex[j] in ":)" else j


# ---- JSON schema: what outlines-core would ignore ------------------------------------------
# outlines-core picks ONE branch per subschema, in this order: properties, allOf, anyOf, oneOf,
# prefixItems, enum, const, $ref, type; every other keyword of that subschema is dropped.
# The checks below replay that dispatch and name each assertion keyword it would drop.

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
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})
# outlines-core's own email / uri regexes can emit '"' inside the JSON string; these cannot.
# Other formats (date, time, date-time, uuid) are honoured by shape only: 2023-02-31 passes.
_SAFE_FORMAT_PATTERNS = {
    "email": r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)*\.[a-zA-Z]{2,}",
    "uri": r"(https?|ftp)://[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}(:[0-9]{1,5})?(/[a-zA-Z0-9._~%!$&'()*+,;=:@-]*)*",
}
_JSON_UNSAFE_BYTES = frozenset([*range(1, 0x20), ord('"'), ord("\\")])


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
    out = {k: v if k in _DATA_KEYWORDS else rewrite_formats(v) for k, v in node.items()}
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
        _scan_regex(body)
        if _can_match_bytes(body, _JSON_UNSAFE_BYTES):
            issues.append(
                f"{path}: pattern {pattern!r} can match '\"', '\\\\' or a control character, "
                "which outlines-core would emit unescaped (invalid JSON); exclude them"
            )
    except ValueError as err:
        issues.append(f"{path}: pattern {pattern!r}: {err}")


def _can_match_bytes(regex: str, byte_values: frozenset[int]) -> bool:
    """Whether some full match of `regex` contains one of `byte_values` (byte-level DFA walk)."""
    from outlines_core import Index, Vocabulary

    tokens = {bytes([b]): [b] for b in range(256)}  # byte 0 is the end marker, as in grammar.py
    index = Index(f"(?:{regex})\\x00", Vocabulary(256, tokens))
    transitions = index.get_transitions()
    reverse: dict[int, set[int]] = {}
    for state, edges in transitions.items():
        for target in edges.values():
            reverse.setdefault(target, set()).add(state)
    live, stack = set(index.get_final_states()), list(index.get_final_states())
    while stack:
        for prev in reverse.get(stack.pop(), ()):
            if prev not in live:
                live.add(prev)
                stack.append(prev)
    return any(
        b in byte_values and target in live
        for state, edges in transitions.items()
        if state in live
        for b, target in edges.items()
    )
