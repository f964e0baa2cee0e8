"""64 concurrent streaming clients on loopback: all finish without errors and the KV pool
returns to its idle level; clients that hang up mid-stream get their requests aborted."""

from __future__ import annotations

import asyncio

import httpx
import pytest

NUM_CLIENTS = 64


def native_body(i: int, max_new_tokens: int) -> dict:
    sp = {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0.8, "seed": i}
    return {"text": f"Client {i} asks: what is {i} + {i}?", "sampling_params": sp, "stream": True}


def chat_body(i: int, max_tokens: int) -> dict:
    messages = [{"role": "user", "content": f"Client {i}: count to {i}"}]
    return {"messages": messages, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}


async def read_stream(
    client: httpx.AsyncClient, route: str, body: dict, hang_up_after: int | None = None
) -> list[str]:
    """The stream's data payloads; with hang_up_after, close the connection after that many."""
    events: list[str] = []
    async with client.stream("POST", route, json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                events.append(line[len("data:") :].strip())
                if hang_up_after is not None and len(events) >= hang_up_after:
                    return events
    return events


async def run_clients(url: str, jobs: list[tuple[str, dict, int | None]]) -> list[list[str]]:
    limits = httpx.Limits(max_connections=NUM_CLIENTS, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        return await asyncio.gather(*(read_stream(client, *job) for job in jobs))


def test_64_streams_finish_and_the_pool_returns_to_idle(server, idle_metrics, parse_sse):
    engine = server.engine
    before = idle_metrics(engine)
    jobs = [("/generate", native_body(i, 24), None) for i in range(NUM_CLIENTS)]
    results = asyncio.run(run_clients(server.url, jobs))
    for events in results:
        assert events[-1] == "[DONE]"
        assert not any('"error"' in e for e in events)
        assert '"length": 24' in events[-2]
    after = idle_metrics(engine)
    assert (
        after["kv_free"] + after["cache_evictable"]
        == before["kv_free"] + before["cache_evictable"]
        == after["kv_capacity"]
    )
    assert after["num_finished"]["length"] - before["num_finished"]["length"] == NUM_CLIENTS


def test_hanging_up_mid_stream_aborts_and_frees(server, idle_metrics):
    engine = server.engine
    before = idle_metrics(engine)
    jobs: list[tuple[str, dict, int | None]] = []
    for i in range(NUM_CLIENTS):
        if i % 2 == 0:
            jobs.append(("/generate", native_body(i, 16), None))
        elif i % 4 == 1:
            jobs.append(("/generate", native_body(i, 400), 3))
        else:
            jobs.append(("/v1/chat/completions", chat_body(i, 400), 3))
    results = asyncio.run(run_clients(server.url, jobs))
    assert all(events[-1] == "[DONE]" for events in results[::2])
    assert all(len(events) == 3 for events in results[1::2])
    after = idle_metrics(engine, timeout=20)
    assert after["num_running"] == 0 and after["num_waiting"] == 0
    assert after["num_finished"]["abort"] - before["num_finished"]["abort"] == NUM_CLIENTS // 2
    assert after["kv_free"] + after["cache_evictable"] == after["kv_capacity"]
    with httpx.Client(base_url=server.url) as client:
        ok = client.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})
        assert ok.status_code == 200


def test_a_non_streaming_client_that_hangs_up_is_aborted(server, idle_metrics):
    engine = server.engine
    before = idle_metrics(engine)
    body = {
        "text": ["The lazy dog"] * 4,
        "sampling_params": {"max_new_tokens": 480, "ignore_eos": True},
    }
    with httpx.Client(base_url=server.url, timeout=0.3) as client:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and hangs up
            client.post("/generate", json=body)
    after = idle_metrics(engine, timeout=20)
    assert after["num_finished"]["abort"] - before["num_finished"]["abort"] == 4
    assert after["num_finished"]["length"] == before["num_finished"]["length"]
