"""SGLang's `structural_tag` constraint: free text in which a trigger opens a tagged structure
(its `begin` text, a value under its JSON schema, its `end` text) that must then be completed;
after it, free text again. Compiled by llguidance as lazy lexemes (llguidance's StructTag), so
the text between tags costs nothing to check.

    {"structures": [{"begin": "<function=get_weather>", "schema": {...}, "end": "</function>"}],
     "triggers": ["<function="]}

Every `begin` must start with one of the triggers. The shape is checked here and each fault
named with its field; the schemas are checked by llguidance when the grammar is built.
"""

from __future__ import annotations

import json
from typing import Any

_FIELDS = {"type", "structures", "triggers"}


def structural_tag_grammar(value: str | dict[str, Any]) -> str:
    """The Lark grammar (llguidance's dialect) of a structural_tag; ValueError names a fault."""
    from llguidance import StructTag

    tag = _parse(value)
    triggers = tag["triggers"]
    tags = []
    for i, s in enumerate(tag["structures"]):
        where = f"structural_tag.structures[{i}]"
        if not isinstance(s, dict) or set(s) != {"begin", "schema", "end"}:
            raise ValueError(f"{where} must be an object with begin, schema and end")
        begin, schema, end = s["begin"], s["schema"], s["end"]
        if not isinstance(begin, str) or not isinstance(end, str):
            raise ValueError(f"{where}: begin and end must be strings")
        if isinstance(schema, str):
            schema = _json(schema, f"{where}.schema")
        if not isinstance(schema, (dict, bool)):
            raise ValueError(f"{where}.schema must be a JSON schema (an object)")
        opening = [t for t in triggers if begin.startswith(t)]
        if not opening:
            raise ValueError(f"{where}.begin {begin!r} starts with none of the triggers {triggers}")
        trigger = max(opening, key=len)
        tags.append(StructTag(trigger=trigger, begin=begin, grammar=schema, end=end))
    return StructTag.to_grammar(tags, assume_special=False)


def _parse(value: str | dict[str, Any]) -> dict[str, Any]:
    tag = _json(value, "structural_tag") if isinstance(value, str) else value
    if not isinstance(tag, dict):
        raise ValueError("structural_tag must be a JSON object with structures and triggers")
    if "format" in tag:
        raise ValueError(
            "structural_tag's 'format' form is not supported; give structures and triggers"
        )
    if unknown := sorted(set(tag) - _FIELDS):
        raise ValueError(f"structural_tag has unknown fields {unknown}; it takes {sorted(_FIELDS)}")
    structures, triggers = tag.get("structures"), tag.get("triggers")
    if not isinstance(structures, list) or not structures:
        raise ValueError("structural_tag.structures must be a non-empty list")
    if (
        not isinstance(triggers, list)
        or not triggers
        or not all(isinstance(t, str) and t for t in triggers)
    ):
        raise ValueError("structural_tag.triggers must be a non-empty list of non-empty strings")
    return tag


def _json(text: str, field: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{field} is not valid JSON: {err}") from None
