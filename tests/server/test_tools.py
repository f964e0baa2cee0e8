"""The tool-call rule (runtime/server/openai/tools.py): what counts as a call under
tool_choice "auto", the constraint a forced call is generated under, and how calls stream.
No server needed."""

from __future__ import annotations

import json

import jsonschema
import pytest
from stemma.bench.tool_schemas import weather_args, weather_tool
from stemma.runtime.server.openai.protocol import ChatCompletionRequest
from stemma.runtime.server.openai.stream import ChatChoiceStream
from stemma.runtime.server.openai.tools import (
    could_become_tool_call,
    parse_tool_calls,
    plan_tools,
    render_tool_calls,
    tool_call_schema,
)

WEATHER = weather_args(("city", "days"), required=("city",))
TOOLS = [
    weather_tool(WEATHER),
    {"type": "function", "function": {"name": "get_time"}},
]
NAMES = {"get_weather", "get_time"}


def request(**fields):
    return ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, **fields}
    )


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',
        '  \n{"name": "get_weather", "arguments": {"city": "Paris"}}\n',
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
        '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
        '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}',
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    ],
)
def test_auto_rule_accepts_one_call(text):
    [call] = parse_tool_calls(text, NAMES)
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_auto_rule_accepts_a_list_of_calls():
    text = '[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {}}]'
    calls = parse_tool_calls(text, NAMES)
    assert [c["function"]["name"] for c in calls] == ["get_time", "get_weather"]


@pytest.mark.parametrize(
    "text",
    [
        "The weather in Paris is sunny.",
        'Sure: {"name": "get_weather", "arguments": {"city": "Paris"}}',
        '{"name": "delete_files", "arguments": {}}',
        '{"name": "get_weather", "arguments": ["Paris"]}',
        '{"name": "get_weather"}',
        '{"name": "get_weather", "arguments": {"city": "Par',
        "[]",
        '{"city": "Paris"}',
    ],
)
def test_auto_rule_rejects_everything_else(text):
    assert parse_tool_calls(text, NAMES) is None


def test_streaming_hold_back_follows_the_rule():
    assert could_become_tool_call("")
    assert could_become_tool_call('  {"na')
    assert could_become_tool_call("<tool")
    assert not could_become_tool_call("The answer")


def test_forced_schemas_accept_exactly_valid_calls():
    required = tool_call_schema(plan_tools(request(tool_choice="required")))
    named = tool_call_schema(
        plan_tools(request(tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    )
    call = {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}
    jsonschema.validate(call, required)
    jsonschema.validate(call, named)
    jsonschema.validate({"name": "get_time", "arguments": {}}, required)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "get_time", "arguments": {}}, named)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "get_weather", "arguments": {"days": 2}}, required)


def test_forced_schema_keeps_the_refs_of_nested_parameters():
    """pydantic writes a nested model as `$defs` + `#/$defs/...`; inside the call wrapper
    those refs must still resolve to the tool's own definitions, and two tools' same-named
    definitions stay apart."""
    address = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    person = {
        "$defs": {"Address": address},
        "type": "object",
        "properties": {"home": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}]}},
        "required": ["home"],
    }
    other = {"$defs": {"Address": {"type": "integer"}}, "$ref": "#/$defs/Address"}
    tools = [
        {"type": "function", "function": {"name": "save", "parameters": person}},
        {"type": "function", "function": {"name": "count", "parameters": other}},
    ]
    schema = tool_call_schema(plan_tools(request(tools=tools, tool_choice="required")))
    jsonschema.validate({"name": "save", "arguments": {"home": {"city": "Oslo"}}}, schema)
    jsonschema.validate({"name": "save", "arguments": {"home": None}}, schema)
    jsonschema.validate({"name": "count", "arguments": 3}, schema)
    for bad in ({"name": "save", "arguments": {"home": {}}}, {"name": "count", "arguments": {}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_tool_choice_consistency_is_checked():
    assert plan_tools(request()).mode == "auto"
    assert plan_tools(request(tool_choice="none")).mode == "none"
    with pytest.raises(ValueError, match="not in tools"):
        plan_tools(request(tool_choice={"type": "function", "function": {"name": "nope"}}))
    with pytest.raises(ValueError, match="needs a non-empty"):
        plan_tools(request(tools=None, tool_choice="required"))


def test_history_renders_calls_in_the_format_the_model_is_asked_for():
    calls = [{"function": {"name": "get_time", "arguments": "{}"}}]
    assert parse_tool_calls(render_tool_calls(calls), NAMES)[0]["function"]["name"] == "get_time"


def chunk(text: str, num_ids: int, finish: dict | None = None) -> dict:
    meta = {
        "finish_reason": finish,
        "prompt_tokens": 5,
        "cached_tokens": 0,
        "completion_tokens": num_ids,
    }
    return {"text": text, "output_ids": list(range(num_ids)), "meta_info": meta}


def test_a_forced_call_streams_as_one_tool_call_delta():
    stream = ChatChoiceStream(0, plan_tools(request(tool_choice="required")), False)
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    deltas = stream.deltas(chunk(call[:10], 3)) + stream.deltas(chunk(call[:30], 8))
    assert [d["delta"] for d in deltas] == [{"role": "assistant", "content": ""}]
    [last] = stream.deltas(chunk(call, 15, {"type": "stop", "matched": 2}))
    assert last["finish_reason"] == "tool_calls"
    [tool_call] = last["delta"]["tool_calls"]
    assert tool_call["index"] == 0 and tool_call["function"]["name"] == "get_weather"


def test_auto_streams_content_once_it_cannot_be_a_call():
    stream = ChatChoiceStream(0, plan_tools(request()), False)
    first = stream.deltas(chunk("The", 1))
    second = stream.deltas(chunk("The sky", 2))
    [last] = stream.deltas(chunk("The sky.", 3, {"type": "stop", "matched": 2}))
    contents = [d["delta"].get("content") for d in first + second + [last]]
    assert contents == ["", "The", " sky", "."]
    assert last["finish_reason"] == "stop"


def test_a_held_text_that_is_no_call_is_sent_at_the_end():
    stream = ChatChoiceStream(0, plan_tools(request()), False)
    assert len(stream.deltas(chunk("{not json", 2))) == 1  # only the role delta
    [last] = stream.deltas(chunk("{not json}", 3, {"type": "length", "length": 3}))
    assert last["delta"] == {"content": "{not json}"} and last["finish_reason"] == "length"


def _auto_grammar(parallel: bool = True):
    import stemma
    from stemma.runtime.server.openai.tools import auto_call_grammar

    return stemma.Constraint(ebnf=auto_call_grammar(plan_tools(request()), parallel))


@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        ("It is sunny in Paris.", True),
        ("", True),
        ("Use <b>bold</b> or a {placeholder}.", True),
        ('{"name":"get_weather","arguments":{"city":"Paris","days":2}}', True),
        ('\n<tool_call>{"name":"get_time","parameters":{}}</tool_call>', True),
        (
            '[{"name":"get_time","arguments":{}},{"name":"get_weather","arguments":{"city":"x"}}]',
            True,
        ),
        ('{"name":"get_weather","arguments":{"days":2}}', False),  # city is required
        ('{"name":"get_weather","arguments":{"city":"P","days":"2"}}', False),
        ('{"name":"get_news","arguments":{}}', False),  # not an offered tool
        ('{"name":"get_time","arguments":{}} and more', False),  # a call ends the reply
        (' {"city": "Paris"}', False),  # opens a call that is none
        ("[1, 2]", False),
    ],
)
def test_auto_grammar_makes_every_begun_call_parse(text, accepted):
    c = _auto_grammar()
    assert c.accepts(text) == accepted
    if accepted and text.strip()[:1] in ("{", "[", "<"):
        assert parse_tool_calls(text, NAMES) is not None


def test_auto_grammar_without_parallel_calls_takes_one_call_only():
    c = _auto_grammar(parallel=False)
    assert c.accepts('{"name":"get_time","arguments":{}}')
    assert not c.accepts('[{"name":"get_time","arguments":{}}]')
