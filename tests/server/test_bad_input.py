"""Every malformed or out-of-range request gets a 4xx with an OpenAI-style JSON error naming
the problem, and the server answers a normal request right after it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
LONG_TEXT = "The quick brown fox jumps over the lazy dog. " * 200  # well over 512 tokens

# (route, body (bytes are sent raw), status, words the message must contain)
CASES: list[tuple[str, Any, int, str]] = [
    ("/generate", b'{"text": "x", ', 400, "not valid JSON"),
    ("/generate", [1, 2], 400, "body"),
    ("/generate", {"text": "x", "bogus": 1}, 400, "bogus"),
    ("/generate", {"text": "x", "sampling_params": {"max_tokens": 5}}, 400, "max_tokens"),
    ("/generate", {"text": 5}, 400, "text"),
    # Found by the OpenAPI fuzzer: both prompts, a list `text` making input_ids read as a batch.
    ("/generate", {"text": [], "input_ids": [-44741]}, 400, "exactly one of 'text'"),
    ("/generate", {"sampling_params": {"max_new_tokens": 1}}, 400, "exactly one of 'text'"),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": "5"}}, 400, "max_new_tokens"),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": -1}}, 400, "max_new_tokens"),
    (
        "/generate",
        {"text": "x", "sampling_params": {"max_new_tokens": 10**9}},
        400,
        "context length",
    ),
    ("/generate", {"text": LONG_TEXT}, 400, "context length"),
    ("/generate", {"input_ids": [5, 100000]}, 400, "vocabulary"),
    ("/generate", {"input_ids": [5, -3]}, 400, "input_ids"),
    ("/generate", {"text": "x", "input_ids": [5]}, 400, "exactly one"),
    ("/generate", {"text": "", "sampling_params": {"max_new_tokens": 1}}, 400, "empty"),
    ("/generate", {"text": "x", "sampling_params": {"regex": "(ab"}}, 400, "regex"),
    (
        "/generate",
        {"text": "x", "sampling_params": {"json_schema": '{"type": "nonsense"}'}},
        400,
        "json_schema",
    ),
    (
        "/generate",
        {"text": "x", "sampling_params": {"json_schema": "{not json"}},
        400,
        "json_schema",
    ),
    ("/generate", {"text": "x", "sampling_params": {"regex": "(?=a)b"}}, 400, "lookahead"),
    (
        "/generate",
        {
            "text": "x",
            "sampling_params": {
                "json_schema": {  # two array branches: not enforced beside the grammar
                    "anyOf": [
                        {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
                        {"type": "array", "maxItems": 2},
                    ]
                }
            },
        },
        400,
        "uniqueItems",
    ),
    ("/generate", {"text": "x", "sampling_params": {"temperature": -1}}, 400, "temperature"),
    ("/generate", {"text": "x", "sampling_params": {"top_p": 0}}, 400, "top_p"),
    ("/generate", {"text": "x", "sampling_params": {"stop": 5}}, 400, "stop"),
    ("/generate", {"text": "x", "sampling_params": {"logit_bias": {"a": 1}}}, 400, "logit_bias"),
    (
        "/generate",
        {"text": "x", "logprob_start_len": 50, "return_logprob": True},
        400,
        "logprob_start_len",
    ),
    # Bounds stated up front (EngineConfig's max_* fields), checked before any work.
    ("/generate", {"text": "hi", "sampling_params": {"n": 100_000}}, 400, "--max-request-items"),
    ("/generate", {"text": ["hi"] * 1025}, 400, "1025 prompts"),
    ("/generate", {"input_ids": [[5]] * 600, "sampling_params": {"n": 2}}, 400, "1200"),
    ("/generate", {"text": "x" * (1 << 20 | 1)}, 400, "--max-prompt-chars"),
    (
        "/generate",
        {"text": "hi", "return_logprob": True, "top_logprobs_num": 1_000_000},
        400,
        "--max-top-logprobs",
    ),
    ("/generate", {"text": "hi", "sampling_params": {"stop": ["s"] * 33}}, 400, "33 stop"),
    (
        "/generate",
        {"text": "hi", "sampling_params": {"stop": ["a"] * 20, "stop_regex": ["b"] * 13}},
        400,
        "--max-stop-strings",
    ),
    ("/generate", {"text": "hi", "sampling_params": {"stop": "z" * 1025}}, 400, "1025 char"),
    ("/generate", {"text": "hi", "sampling_params": {"regex": "a" * 300_000}}, 400, "300000 char"),
    (
        "/generate",
        {"text": "hi", "sampling_params": {"stop_regex": "(" * 600 + "a" + ")" * 600}},
        400,
        "--max-stop-chars",
    ),
    (
        "/generate",
        {"text": "hi", "sampling_params": {"regex": "(" * 600 + "a" + ")" * 600}},
        400,
        "regex",
    ),
    ("/generate", {"text": "hi", "sampling_params": {"regex": "a{0,4294967296}"}}, 400, "regex"),
    ("/generate", {"text": "x", "sampling_params": {"stop_regex": "a{0,4294967296}"}}, 400, "stop"),
    ("/tokenize", {}, 400, "prompt"),
    ("/abort_request", {}, 400, "rid"),
    (CHAT, {"model": "tiny", "messages": []}, 400, "messages"),
    (CHAT, {"model": "gpt-4", "messages": USER}, 404, "does not exist"),
    (CHAT, {"messages": USER, "max_tokens": -1}, 400, "max_tokens"),
    (CHAT, {"messages": USER, "max_tokens": 10**9}, 400, "max_tokens"),
    (CHAT, {"messages": USER, "foo": 1}, 400, "foo"),
    (CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "role"),
    (CHAT, {"messages": [{"role": "user"}]}, 400, "content"),
    (CHAT, {"messages": [{"role": "user", "content": LONG_TEXT}]}, 400, "context length"),
    (CHAT, {"messages": USER, "n": 0}, 400, "n"),
    (CHAT, {"messages": USER, "top_logprobs": 2}, 400, "top_logprobs"),
    (CHAT, {"messages": USER, "regex": "[a-"}, 400, "regex"),
    (
        CHAT,
        {
            "messages": USER,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
            },
        },
        400,
        "response_format",
    ),
    (CHAT, {"messages": USER, "response_format": {"type": "yaml"}}, 400, "response_format"),
    (
        CHAT,
        {
            "messages": USER,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        },
        400,
        "not in tools",
    ),
    (CHAT, {"messages": USER, "tool_choice": "required"}, 400, "tools"),
    ("/v1/completions", {"prompt": LONG_TEXT}, 400, "context length"),
    ("/v1/completions", {"prompt": []}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x", "logprobs": 50}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "x", "suffix": "y"}, 400, "suffix"),
    ("/v1/completions", {"prompt": [1, 2, 99999]}, 400, "prompt"),
]


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.mark.parametrize(("route", "body", "status", "words"), CASES)
def test_bad_request_then_a_good_one(client, route, body, status, words):
    if isinstance(body, bytes):
        r = client.post(route, content=body, headers={"Content-Type": "application/json"})
    else:
        r = client.post(route, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error["message"]
    assert error["type"] in ("invalid_request_error", "not_found_error")
    ok = client.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}})
    assert ok.status_code == 200


def test_wrong_method_and_unknown_route(client):
    r = client.get(CHAT)
    assert r.status_code == 405 and "error" in r.json()
    r = client.post("/v2/generate", json={})
    assert r.status_code == 404 and "/v2/generate" in r.json()["error"]["message"]


def test_form_encoded_body_is_named(client):
    r = client.post(
        "/generate",
        content=b'{"text": "x"}',
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 400
    assert "Content-Type: application/json" in r.json()["error"]["message"]
