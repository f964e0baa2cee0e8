"""A JSON schema llguidance surely refuses as written, told without llguidance's own compile.

llguidance refuses a subschema it compiles that holds a keyword its draft defines and llguidance
does not implement ("Unimplemented keys: [...]"), or a `format` it does not know where strings
may pass ("Unknown format: ..."). Finding that out costs a compile up to the keyword: for the
large schemas of the sample, 0.3-1 ms before their rewrite (schema_rewrite.py) is even tried.
`refused_as_written` finds such a keyword with a walk of the subschemas llguidance surely
compiles: the root, the members of its combinators, the targets of its local `$ref`s, and the
subschemas of a kind of value the schema allows (`properties` where objects may pass, `items`
where arrays may). It says True only where it finds one, so a schema it misjudges is at worst
rewritten (exactly: the same instances pass) rather than taken as written.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .schema_logic import pointer

# The keywords each draft defines that llguidance 1.9 does not implement (its draft.rs and the
# IMPLEMENTED list of json/schema.rs); a schema without "$schema" is read as 2020-12.
_DRAFT_4 = frozenset({"not", "uniqueItems", "dependencies"})
_DRAFT_6 = _DRAFT_4 | {"contains", "propertyNames"}
_DRAFT_7 = _DRAFT_6 | {"if", "then", "else"}
_DRAFT_2019 = _DRAFT_7 | {
    "$recursiveAnchor",
    "$recursiveRef",
    "dependentRequired",
    "dependentSchemas",
    "maxContains",
    "minContains",
    "unevaluatedItems",
    "unevaluatedProperties",
}
_DRAFT_2020 = _DRAFT_2019 | {"$dynamicAnchor", "$dynamicRef"}
_UNIMPLEMENTED = {
    "https://json-schema.org/draft/2020-12/schema": _DRAFT_2020,
    "https://json-schema.org/draft/2019-09/schema": _DRAFT_2019,
    "http://json-schema.org/draft-07/schema": _DRAFT_7,
    "http://json-schema.org/draft-06/schema": _DRAFT_6,
    "http://json-schema.org/draft-04/schema": _DRAFT_4,
}
# Any of them as an object key in a schema's JSON text.
_KEYWORD_TEXT = re.compile('"(?:' + "|".join(sorted(map(re.escape, _DRAFT_2020))) + ')":')
_OBJECT_SUBSCHEMAS = ("properties", "patternProperties")
_ARRAY_SUBSCHEMAS = ("items", "additionalItems", "prefixItems")


def may_be_refused(text: str) -> bool:
    """Whether the JSON schema `text` names a keyword refused_as_written looks for (a scan of
    the text: without one, there is nothing to walk for). A format llguidance does not know
    is no reason to walk: most such formats in the sample are on numbers (OpenAPI's "int32",
    "double"), which llguidance ignores, and the large schemas that hold them would be
    parsed for nothing."""
    return _KEYWORD_TEXT.search(text) is not None


def refused_as_written(schema: Any, known_format: Callable[[str], bool]) -> bool:
    """Whether llguidance surely refuses `schema` as written: a subschema it compiles holds a
    keyword of the schema's draft that llguidance does not implement, or a format it does not
    know (known_format(name) -> bool) where strings may pass (see the module)."""
    if not isinstance(schema, dict):
        return False
    declared = schema.get("$schema", "https://json-schema.org/draft/2020-12/schema")
    unimplemented = _UNIMPLEMENTED.get(declared.rstrip("#") if isinstance(declared, str) else "")
    if unimplemented is None:  # a draft llguidance does not know: it refuses for that reason
        return False
    seen: set[int] = set()
    stack: list[Any] = [schema]
    while stack:
        s = stack.pop()
        if not isinstance(s, dict) or id(s) in seen:
            continue
        seen.add(id(s))
        if not unimplemented.isdisjoint(s):
            return True
        fmt = s.get("format")
        if isinstance(fmt, str) and _allows(s, "string") and not known_format(fmt):
            return True
        for key in ("allOf", "anyOf", "oneOf"):
            if isinstance(s.get(key), list):
                stack += s[key]
        if isinstance(s.get("$ref"), str):
            stack.append(pointer(schema, s["$ref"]))
        if _allows(s, "object"):
            for key in _OBJECT_SUBSCHEMAS:
                if isinstance(s.get(key), dict):
                    stack += s[key].values()
            stack.append(s.get("additionalProperties"))
        if _allows(s, "array"):
            for key in _ARRAY_SUBSCHEMAS:
                value = s.get(key)
                stack += value if isinstance(value, list) else [value]
    return False


def _allows(s: dict[str, Any], kind: str) -> bool:
    """`s`'s own `type` lets values of `kind` pass (a `type` of no known form: taken as not)."""
    named = s.get("type", kind)
    return named == kind or (isinstance(named, list) and kind in named)
