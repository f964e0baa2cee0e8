"""The get_weather tool, the one tool schema that benches and tests share: the schema of its
arguments (city, unit, days), of a call {"name": ..., "arguments": ...} as a constrained output,
and its entry in an OpenAI request's `tools`. A variant (fewer fields, fewer of them required,
a bounded city, a closed object, another schema for a field) is asked for by keyword, so every
use reads as the shared tool plus its difference."""

from __future__ import annotations

import copy
from typing import Any

WEATHER_FIELDS: dict[str, dict[str, Any]] = {
    "city": {"type": "string"},
    "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer"},
}
WEATHER_DESCRIPTION = "Current weather in a city"
# What a call may name where a schema offers more than get_weather.
TOOL_NAMES = ("get_weather", "get_time", "search_web")


def weather_args(
    fields: tuple[str, ...] = tuple(WEATHER_FIELDS),
    required: tuple[str, ...] | None = None,
    max_city_len: int | None = None,
    closed: bool = False,
    **field_schemas: dict[str, Any],
) -> dict[str, Any]:
    """The schema of get_weather's arguments: `fields` in this order (each as in
    WEATHER_FIELDS unless `field_schemas` gives it), all of them required unless `required`
    names fewer, a city of at most `max_city_len` characters, and no other keys where
    `closed`."""
    if not set(fields) <= WEATHER_FIELDS.keys() or not field_schemas.keys() <= set(fields):
        raise ValueError(
            f"get_weather's fields are {list(WEATHER_FIELDS)}; asked for {list(fields)}, "
            f"with schemas for {sorted(field_schemas)}"
        )
    properties = {f: copy.deepcopy(field_schemas.get(f, WEATHER_FIELDS[f])) for f in fields}
    if max_city_len is not None:
        properties["city"]["maxLength"] = max_city_len
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": list(fields if required is None else required),
    }
    if closed:
        schema["additionalProperties"] = False
    return schema


def tool_call(
    arguments: dict[str, Any], names: tuple[str, ...] = ("get_weather",)
) -> dict[str, Any]:
    """The schema of one call, {"name": ..., "arguments": ...}, naming the one tool or any
    of `names`."""
    name = {"const": names[0]} if len(names) == 1 else {"enum": list(names)}
    return {
        "type": "object",
        "properties": {"name": name, "arguments": arguments},
        "required": ["name", "arguments"],
    }


def weather_tool(arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    """get_weather as an entry of an OpenAI request's `tools` (its arguments: weather_args()
    unless given)."""
    return {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": WEATHER_DESCRIPTION,
            "parameters": weather_args() if arguments is None else arguments,
        },
    }
