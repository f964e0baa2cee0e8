"""The native SGLang routes over a live server on the tiny model: /generate (single, batch,
stream, logprobs, max_new_tokens 0), info, health, tokenize, flush, abort, metrics."""

from __future__ import annotations

import json
from itertools import pairwise

import httpx
import pytest

GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def test_generate_single_equals_the_engine(client, server):
    sp = {**GREEDY, "max_new_tokens": 8}
    r = client.post("/generate", json={"text": "The quick brown", "sampling_params": sp})
    assert r.status_code == 200
    out = r.json()
    expected = server.engine.generate("The quick brown", sp)
    assert out["output_ids"] == expected["output_ids"]
    assert out["text"] == expected["text"]
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == len(server.engine.tokenize("The quick brown"))
    assert meta["completion_tokens"] == 8
    assert meta["finish_reason"] == {"type": "length", "length": 8}
    assert {"id", "cached_tokens", "e2e_latency"} <= set(meta)


def test_generate_batch_of_texts_and_of_ids(client, server):
    sp = {**GREEDY, "max_new_tokens": 4}
    texts = ["def add(a, b):", "Numbers: 0 1 2"]
    r = client.post("/generate", json={"text": texts, "sampling_params": sp})
    assert r.status_code == 200
    outs = r.json()
    assert [len(o["output_ids"]) for o in outs] == [4, 4]
    ids = [server.engine.tokenize(t) for t in texts]
    r2 = client.post("/generate", json={"input_ids": ids, "sampling_params": sp})
    assert [o["output_ids"] for o in r2.json()] == [o["output_ids"] for o in outs]
    r3 = client.post("/generate", json={"text": texts[0], "sampling_params": {**sp, "n": 3}})
    assert len(r3.json()) == 3


def test_generate_stream_is_cumulative_and_ends_with_done(client, server, parse_sse):
    sp = {**GREEDY, "max_new_tokens": 12}
    body = {"text": "What is the capital", "sampling_params": sp, "stream": True}
    r = client.post("/generate", json=body)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) >= 2
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in pairwise(texts))
    assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    final = client.post("/generate", json={**body, "stream": False}).json()
    assert chunks[-1]["text"] == final["text"]
    assert chunks[-1]["output_ids"] == final["output_ids"]


def test_logprobs_with_logprob_start_len(client, server, hf_ref, tiny_llama_dir, make_prompts):
    [ids] = make_prompts([10], 384, 21)
    body = {
        "input_ids": ids,
        "sampling_params": {**GREEDY, "max_new_tokens": 3},
        "return_logprob": True,
        "logprob_start_len": 4,
        "top_logprobs_num": 2,
        "return_text_in_logprobs": True,
    }
    meta = client.post("/generate", json=body).json()["meta_info"]
    prompt_lps = meta["input_token_logprobs"]
    assert [entry[1] for entry in prompt_lps] == ids[4:]
    reference = hf_ref.prompt_logprobs(tiny_llama_dir, ids)[3:]
    assert [entry[0] for entry in prompt_lps] == pytest.approx(reference, abs=1e-3)
    assert all(isinstance(entry[2], str) for entry in prompt_lps)
    assert len(meta["output_token_logprobs"]) == 3
    assert [len(top) for top in meta["output_top_logprobs"]] == [2, 2, 2]
    from_start = client.post("/generate", json={**body, "logprob_start_len": 0}).json()
    assert from_start["meta_info"]["input_token_logprobs"][0][0] is None


def test_max_new_tokens_zero_prefills_and_caches(client, server):
    [ids] = [list(range(40, 80))]
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 0}}
    first = client.post("/generate", json=body).json()
    assert first["text"] == "" and first["output_ids"] == []
    assert first["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    again = client.post("/generate", json={**body, "sampling_params": {"max_new_tokens": 1}})
    assert again.json()["meta_info"]["cached_tokens"] >= len(ids) - 1


def test_info_and_health_routes(client, server):
    info = client.get("/get_model_info").json()
    assert info == client.get("/model_info").json()
    assert info["chat_template"] == server.engine.get_model_info()["chat_template"]
    assert info["served_model_name"] == "tiny"
    server_info = client.get("/get_server_info").json()
    assert server_info["engine_config"]["max_running_requests"] == 64
    assert server_info["context_length"] == 512
    assert server_info["dtype"] == "float32" and server_info["dtype_reason"] == "explicit"
    assert client.get("/server_info").json()["served_model_name"] == "tiny"
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/health_generate").json() == {"status": "ok"}


def test_tokenize_equals_the_engine(client, server):
    text = "Unicode: café, naïve"
    assert client.post("/tokenize", json={"text": text}).json()["tokens"] == (
        server.engine.tokenize(text)
    )


def test_flush_cache_empties_the_prefix_cache(client, server, idle_metrics):
    body = {"input_ids": list(range(100, 130)), "sampling_params": {"max_new_tokens": 1}}
    client.post("/generate", json=body)
    idle_metrics(server.engine)
    assert client.post("/flush_cache").json()["success"] is True
    get = client.get("/flush_cache")  # state changes only by POST
    assert get.status_code == 405 and "Method Not Allowed" in get.json()["error"]["message"]
    assert client.post("/generate", json=body).json()["meta_info"]["cached_tokens"] == 0


def test_abort_request_ends_a_stream_with_an_error_event(client, server, idle_metrics, step_gate):
    """The engine is held after the first token until the abort is sent, so the request
    cannot run to its 400 tokens first on a fast CPU: one more step, then the abort."""
    gate = step_gate(server.engine, free=1)  # the prefill: the first token
    body = {
        "text": "The lazy dog",
        "rid": "abort-me",
        "sampling_params": {**GREEDY, "max_new_tokens": 400},
        "stream": True,
    }
    lines = []
    with client.stream("POST", "/generate", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                lines.append(line[len("data:") :].strip())
                if len(lines) == 1:
                    aborted = client.post("/abort_request", json={"rid": "abort-me"})
                    assert aborted.json()["aborted"] == ["abort-me"]
                    gate.release()
    assert lines[-1] == "[DONE]"
    error = json.loads(lines[-2])["error"]
    assert "abort" in error["message"]
    assert len(lines) <= 4  # two tokens at most (the held step's), the error, [DONE]
    assert idle_metrics(server.engine)["num_running"] == 0


def test_metrics_exposes_counts_gauges_and_histograms(client, server):
    client.post("/generate", json={"text": "Paris", "sampling_params": {"max_new_tokens": 2}})
    text = client.get("/metrics").text
    for name in (
        'stemma_http_requests_total{route="/generate",status="200"}',
        "stemma_prompt_tokens_total",
        "stemma_generation_tokens_total",
        "stemma_cached_tokens_total",
        "stemma_cache_hit_rate",
        "stemma_num_running_requests",
        "stemma_num_waiting_requests",
        "stemma_kv_usage",
        "stemma_time_to_first_token_seconds_bucket",
        "stemma_time_per_output_token_seconds_bucket",
        "stemma_e2e_request_latency_seconds_count",
    ):
        assert name in text
    e2e_count = next(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("stemma_e2e_request_latency_seconds_count")
    )
    assert e2e_count >= 1
