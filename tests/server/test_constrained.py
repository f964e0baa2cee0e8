"""Constrained outputs over HTTP: regex / json_schema on /generate, response_format and
forced tool calls on /v1/chat/completions. Every output must match or validate."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest
from stemma.bench.tool_schemas import weather_args, weather_tool

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "country": {"type": "string"}},
    "required": ["city", "country"],
    "additionalProperties": False,
}
WEATHER_TOOL = weather_tool(weather_args(("city", "unit"), max_city_len=30, closed=True))
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "maxLength": 30}},
            "required": ["timezone"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather like in Paris right now?"}]


@pytest.fixture()
def smol(smol_server):
    with openai.OpenAI(base_url=f"{smol_server.url}/v1", api_key="x", max_retries=0) as c:
        yield c


def test_generate_regex_and_json_schema_on_the_tiny_model(server):
    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
        "required": ["answer", "sure"],
        "additionalProperties": False,
    }
    check_regex_and_schema(server.url, schema, max_new_tokens=48)


def check_regex_and_schema(url: str, schema: dict, max_new_tokens: int) -> None:
    """A regex over a batch fullmatches; a schema's output finishes and validates."""
    with httpx.Client(base_url=url, timeout=60) as c:
        regex = "(yes|no|maybe), (red|green)"
        sp = {"regex": regex, "max_new_tokens": 32}
        r = c.post("/generate", json={"text": ["Answer:", "Colour?"], "sampling_params": sp})
        assert r.status_code == 200
        assert all(re.fullmatch(regex, out["text"]) for out in r.json())
        sp = {"json_schema": json.dumps(schema), "max_new_tokens": max_new_tokens, "temperature": 0}
        r = c.post("/generate", json={"text": "JSON:", "sampling_params": sp})
        assert r.status_code == 200
        assert r.json()["meta_info"]["finish_reason"]["type"] == "stop"
        jsonschema.validate(json.loads(r.json()["text"]), schema)


def test_response_format_json_schema_validates(smol):
    r = smol.chat.completions.create(
        model="smollm2-135m",
        messages=[{"role": "user", "content": "Name the capital of France as JSON."}],
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}},
    )
    jsonschema.validate(json.loads(r.choices[0].message.content), CITY)
    assert r.choices[0].finish_reason == "stop"


def test_response_format_json_object_parses(smol):
    r = smol.chat.completions.create(
        model="smollm2-135m",
        messages=[
            {
                "role": "user",
                "content": "Give the name and country of the capital of "
                "France as a small JSON object.",
            }
        ],
        max_tokens=80,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_required_tool_call_parses_and_validates(smol):
    r = smol.chat.completions.create(
        model="smollm2-135m",
        messages=ASK,
        tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice="required",
        max_tokens=60,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    tool = {"get_weather": WEATHER_TOOL, "get_time": TIME_TOOL}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


def test_named_tool_call_streams_as_one_tool_call_delta(smol):
    stream = smol.chat.completions.create(
        model="smollm2-135m",
        messages=ASK,
        tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=60,
        temperature=0,
        stream=True,
    )
    chunks = [c for c in stream if c.choices]
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [tc.function.name for tc in calls] == ["get_time"]
    jsonschema.validate(
        json.loads(calls[0].function.arguments), TIME_TOOL["function"]["parameters"]
    )
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
