"""cache_salt (vLLM's field, on /generate and the OpenAI routes): requests with different
salts never share cached K/V, so `cached_tokens` says nothing about another tenant's prompts;
requests with the same salt share as before. Exact counts on the tiny model (page_size 1: a
repeated 40-token prompt hits 39 tokens, the last one is always computed)."""

from __future__ import annotations

import random

import httpx
import pytest

HIT = 39  # of a 40-token prompt


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def fresh_prompt(seed: int) -> list[int]:
    """40 ids no other test sends, so nothing of it is cached before the test."""
    rng = random.Random(seed)
    return [rng.randrange(5, 250) for _ in range(40)]


def native(client: httpx.Client, ids: list[int], salt: str | None) -> int:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}
    r = client.post("/generate", json=body | ({} if salt is None else {"cache_salt": salt}))
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]["cached_tokens"]


def completion(client: httpx.Client, ids: list[int], salt: str | None) -> int:
    body = {"model": "tiny", "prompt": ids, "max_tokens": 1, "cache_salt": salt}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize(
    "send, seed", [(native, 7101), (completion, 7102)], ids=["generate", "v1-completions"]
)
def test_salts_separate_the_prefix_cache(client, send, seed):
    ids = fresh_prompt(seed)
    seen = [
        send(client, ids, "alice"),
        send(client, ids, "bob"),  # without salts this would be a 39-token hit
        send(client, ids, "alice"),
        send(client, ids, None),
        send(client, ids, None),
        send(client, ids, "bob"),
    ]
    assert seen == [0, 0, HIT, 0, HIT, HIT]


def test_chat_takes_a_cache_salt(client):
    message = {"role": "user", "content": "a private question, asked twice"}
    body = {"model": "tiny", "max_tokens": 1, "messages": [message]}
    counts = []
    for salt in ("carol", "dave", "carol"):
        r = client.post("/v1/chat/completions", json=body | {"cache_salt": salt})
        assert r.status_code == 200, r.text
        counts.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    prompt_tokens = r.json()["usage"]["prompt_tokens"]
    assert counts == [0, 0, prompt_tokens - 1]


@pytest.mark.parametrize(
    "salt, message",
    [
        ("", "cache_salt has 0 characters; it needs 1 to 1024"),
        ("s" * 1025, "cache_salt has 1025 characters; it needs 1 to 1024"),
        (7, "cache_salt"),
    ],
)
def test_a_bad_salt_is_400(client, salt, message):
    body = {"text": "hi", "cache_salt": salt, "sampling_params": {"max_new_tokens": 1}}
    r = client.post("/generate", json=body)
    assert r.status_code == 400 and message in r.json()["error"]["message"]
