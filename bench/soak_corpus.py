"""What the soak sends: prompt words, constraints (valid, bounded so they complete, and
pathological), tools, malformed bodies, and the forked DSL program (soak_traffic.py)."""

from __future__ import annotations

from typing import Any

from ..lang import assistant, function, gen, select, system, user
from .tool_schemas import weather_args, weather_tool

WORDS = "tide lamp gull rope fog keel mast chart reef buoy storm harbor lantern oar".split()

REGEXES = [
    r"[0-9]{3}-[0-9]{4}",
    r"(yes|no|maybe)",
    r"[A-Z][a-z]{2,8} [A-Z][a-z]{2,8}",
    r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    r"#[0-9a-f]{6}",
]
SCHEMAS = [
    weather_args(("city", "days"), max_city_len=12, closed=True, days={"enum": [1, 2, 3, 5, 7]}),
    {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "tag": {"enum": ["red", "green", "blue"]}},
        "required": ["ok", "tag"],
        "additionalProperties": False,
    },
]
TOOLS = [weather_tool(weather_args(("city", "unit"), max_city_len=12, closed=True))]
# Patterns that blow up or run out a compile: each ends valid or as a 400 naming the limit.
PATHOLOGICAL = [
    {"regex": "(a|aa)*" + "b{1,400}" * 6},
    {"json_schema": {"type": "object", "properties": {"a": {"type": "string", "maxLength": 600}}}},
    {"regex": "(" * 300 + "x" + ")" * 300},
    {"regex": "[unclosed"},
]
MALFORMED: list[tuple[str, Any]] = [
    ("/generate", b"{not json"),
    ("/generate", {"text": 5}),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": -3}}),
    ("/generate", {"text": "hi", "sampling_params": {"temperature": "hot"}}),
    ("/generate", {"text": "hi", "surprise": True}),
    ("/generate", {"text": "hi", "input_ids": [1, 2]}),
    ("/generate", {"text": "hi", "sampling_params": {"regex": "(", "json_schema": "{}"}}),
    ("/v1/chat/completions", {"model": "x", "messages": []}),
    ("/v1/chat/completions", {"model": "x", "messages": [{"role": "wizard", "content": "hi"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 0}),
    ("/v1/completions", {"model": "x", "prompt": "hi", "max_tokens": "many"}),
]


@function
def forked_program(s, topic: str) -> list[str]:
    s += system("You answer briefly.")
    s += user(f"Say three things about the {topic}.")
    forks = s.fork(3)
    for i, f in enumerate(forks):
        f += assistant(f"Thing {i + 1}: " + gen("thing", max_tokens=12, stop="\n"))
    s += user("Was that useful? Answer yes or no.")
    s += assistant(select("pick", choices=["yes", "no"]))
    return [f["thing"] for f in forks]
