"""Hostile requests: small bodies that once cost the server unbounded time or memory, or
answered 500. Each names the statuses it may get; a 4xx must carry a JSON error. The hostile
test (tests/server/test_hostile.py) sends every one beside a victim request, and the soak
mixes them into its traffic."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DEEP_NESTING = 18  # a 467-byte schema this deep made outlines-core's regex 2.4M characters
ADMIN_ROUTES = ("/flush_cache", "/debug/memory")


@dataclass(frozen=True, slots=True)
class HostileRequest:
    name: str
    path: str
    body: Any
    statuses: tuple[int, ...] = (400,)
    # Replaces the client's Authorization header (None: the client's own key).
    authorization: bytes | None = None


def nested_schema(depth: int) -> dict[str, Any]:
    """An array inside an object, `depth` levels: outlines-core doubles its regex at each."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {
            "type": "object",
            "properties": {"a": {"type": "array", "items": schema}},
            "required": ["a"],
        }
    return schema


def _generate(max_new_tokens: int = 4, text: str = "x", **params: Any) -> dict[str, Any]:
    return {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, **params}}


def _chat(model: str, **extra: Any) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return body | extra


def _tool(parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


def _tool_turn(arguments: str) -> list[dict[str, Any]]:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "ok"},
    ]


def hostile_requests(model: str) -> list[HostileRequest]:
    """Every hostile request, for a server that serves `model` under an API key."""
    deep = nested_schema(DEEP_NESTING)
    deep_format = {"type": "json_schema", "json_schema": {"name": "d", "schema": deep}}
    forced = {"type": "function", "function": {"name": "f"}}
    groups = "(" * 600 + "a" + ")" * 600
    chain = '{"type":"array","items":' * 1200 + '{"type":"string"}' + "}" * 1200
    r = HostileRequest
    return [
        r("schema-depth-18-generate", "/generate", _generate(json_schema=json.dumps(deep))),
        r(
            "schema-depth-18-response-format",
            "/v1/chat/completions",
            _chat(model, response_format=deep_format),
        ),
        r(
            "schema-depth-18-tools-required",
            "/v1/chat/completions",
            _chat(model, tools=[_tool(deep)], tool_choice="required"),
        ),
        r(
            "schema-depth-18-tools-named",
            "/v1/chat/completions",
            _chat(model, tools=[_tool(deep)], tool_choice=forced),
        ),
        r("schema-chain-1200", "/generate", _generate(json_schema=chain)),
        r(
            "schema-maxlength-2-32",
            "/generate",
            _generate(json_schema=json.dumps({"type": "string", "maxLength": 2**32})),
        ),
        r(
            "pattern-automaton-explodes",
            "/generate",
            _generate(json_schema=json.dumps({"type": "string", "pattern": "(a|b)*a(a|b){26}"})),
            statuses=(200, 400),
        ),
        r("regex-600-groups", "/generate", _generate(regex=groups)),
        r("regex-huge-repeat", "/generate", _generate(regex="a{0,4294967296}")),
        r("stop-regex-600-groups", "/generate", _generate(stop_regex=groups)),
        r(
            "stop-regex-backtracking",
            "/generate",
            _generate(48, regex="a{40}", stop_regex="(a+)+b", stop="zz"),
            statuses=(200,),
        ),
        r("stop-regex-alone", "/generate", _generate(8, stop_regex="(a+)+b"), statuses=(200,)),
        r("stop-strings-1000-of-8k", "/generate", _generate(stop=["s" * 8192] * 1000)),
        r("n-100000", "/generate", {"text": "hi", "sampling_params": {"n": 100000}}),
        r("batch-100000", "/generate", {"text": ["hi"] * 100000}),
        r(
            "completions-prompts-100000",
            "/v1/completions",
            {"model": model, "prompt": ["hi"] * 100000, "max_tokens": 1},
        ),
        r(
            "top-logprobs-1000000",
            "/generate",
            _generate(2) | {"return_logprob": True, "top_logprobs_num": 1000000},
        ),
        r(
            "tool-arguments-nested-3000",
            "/v1/chat/completions",
            _chat(model, messages=_tool_turn("[" * 3000 + "1" + "]" * 3000)),
            statuses=(200, 400),
        ),
        r(
            "non-ascii-bearer",
            "/generate",
            _generate(2),
            statuses=(401,),
            authorization="Bearer caf\u00e9".encode(),
        ),
    ]
