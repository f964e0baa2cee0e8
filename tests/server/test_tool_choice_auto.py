"""tool_choice "auto" through the official openai client on the built-in model: 3 offered
tools, 50 prompts, greedy. Every reply that opens a call is one that parses, names an offered
tool and whose arguments validate; the rest is plain content (tools.py's auto_call_grammar).

A 135M model seldom opens a call by itself, so every other request begins one through
`logit_bias` on "{" (the grammar allows it there and nowhere in prose): the grammar must carry
each begun call to a valid end. The tools' parameters are closed and their strings bounded, so
a call fits in max_tokens whatever the bias does inside it. The default suite runs 10 of the
prompts; the whole 50 are `slow` (pytest -m slow)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
from stemma.bench.tool_schemas import weather_args, weather_tool

WEATHER = weather_args(("city", "unit"), required=("city",), max_city_len=24, closed=True)
TOOLS = [
    weather_tool(WEATHER)["function"],
    {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                "b": {"type": "integer", "minimum": -1000, "maximum": 1000},
            },
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
    {
        "name": "search",
        "description": "Search the web",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "maxLength": 24}},
            "required": ["query"],
            "additionalProperties": False,
        },
    },
]
SCHEMAS = {t["name"]: t["parameters"] for t in TOOLS}
CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Delhi", "Rome", "Quito", "Seoul", "Perth"]
PROMPTS = [f"What is the weather in {c}?" for c in CITIES]
PROMPTS += [f"What is {a} plus {b}?" for a, b in zip(range(3, 93, 9), range(7, 77, 7))]
PROMPTS += [f"Search the web for news about {c}." for c in CITIES]
PROMPTS += [f"Write one sentence about {c}." for c in CITIES]
PROMPTS += [f"Say hello to {name}." for name in ["Ann", "Bo", "Cy", "Di", "Ed", "Flo"]]
PROMPTS += ["Who are you?", "Tell me a joke.", "Thanks!", "What can you do?"]
CALL_OPENERS = ("{", "[", "<tool_call>")


@pytest.mark.parametrize(
    "prompts", [PROMPTS[::5], pytest.param(PROMPTS, marks=pytest.mark.slow)], ids=["10", "50"]
)
def test_every_begun_call_parses_and_names_an_offered_tool(smol_server, prompts) -> None:
    assert len(PROMPTS) == 50
    client = openai.OpenAI(base_url=smol_server.url + "/v1", api_key="none")
    tools = [{"type": "function", "function": t} for t in TOOLS]
    [brace] = smol_server.engine.tokenizer.encode("{")

    def ask(k: int):
        bias = {str(brace): 100} if k % 2 else None
        return client.chat.completions.create(
            model="smollm2-135m",
            messages=[{"role": "user", "content": prompts[k]}],
            tools=tools,
            max_tokens=64,
            temperature=0,
            logit_bias=bias,
        ).choices[0]

    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        choices = list(pool.map(ask, range(len(prompts))))
    for k, choice in enumerate(choices):
        calls = choice.message.tool_calls
        if calls:
            assert choice.finish_reason == "tool_calls", prompts[k]
            for call in calls:
                args = json.loads(call.function.arguments)
                jsonschema.validate(args, SCHEMAS[call.function.name])
        else:
            content = choice.message.content or ""
            assert not content.lstrip().startswith(CALL_OPENERS), (prompts[k], content)
        if k % 2:  # the call begun by the bias was finished
            assert calls, (prompts[k], choice.message.content)
