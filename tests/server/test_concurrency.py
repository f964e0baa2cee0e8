"""64 concurrent streaming clients on loopback: all finish without errors and the KV pool
returns to its idle level; clients that hang up mid-stream get their requests aborted.

The hang-up tests hold the engine (the step gate) until the server has aborted every request
whose client left, so no request can finish first, however fast this CPU is."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import httpx
import pytest
from stemma.runtime.scheduler.batch import ScheduledBatch

NUM_CLIENTS = 64
HANG_UP_TOKENS = 400  # the hang-up clients' requests; no other request asks for as many


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


def start_when_queued(engine, monkeypatch: pytest.MonkeyPatch, n: int) -> threading.Event:
    """Until n requests are queued the engine's steps find nothing to run (the loop then waits
    on its inbox, as while a constraint compiles), so all n start in the same steps however
    their connections interleave. The event is set at the first real step."""
    scheduler, real, started = engine.scheduler, engine.scheduler.schedule, threading.Event()

    def schedule():
        if not started.is_set():
            if len(scheduler.waiting) + len(scheduler.running) < n:
                return ScheduledBatch([], [], [])
            started.set()
        return real()

    monkeypatch.setattr(scheduler, "schedule", schedule)
    return started


def release_after_aborts(
    engine, monkeypatch: pytest.MonkeyPatch, n: int, release: Callable[[], None]
) -> set[str]:
    """The rids the server aborts; `release` runs once n distinct rids are aborted."""
    real_abort, aborted = engine.abort, set()

    def abort(rid: str, message: str = "aborted by the caller") -> None:
        real_abort(rid, message)
        aborted.add(rid)
        if len(aborted) == n:
            release()

    monkeypatch.setattr(engine, "abort", abort)
    return aborted


def test_hanging_up_mid_stream_aborts_and_frees(server, idle_metrics, step_gate, monkeypatch):
    """Half the clients hang up after their first event. Every request starts in the same
    steps, and the engine is held once each hang-up request has its first token (so each of
    those clients gets its event) until the server has aborted all 32: none of them can reach
    its 400 tokens first. The other 32 then finish in full."""
    engine = server.engine
    scheduler = engine.scheduler
    before = idle_metrics(engine)
    started = start_when_queued(engine, monkeypatch, NUM_CLIENTS)

    def every_hang_up_has_a_token() -> bool:
        queued = scheduler.waiting + scheduler.running
        hang_ups = [r for r in queued if r.params.max_new_tokens == HANG_UP_TOKENS]
        return started.is_set() and all(r.output_ids for r in hang_ups)

    gate = step_gate(engine, when=every_hang_up_has_a_token)
    aborted = release_after_aborts(engine, monkeypatch, NUM_CLIENTS // 2, gate.release)
    jobs: list[tuple[str, dict, int | None]] = []
    for i in range(NUM_CLIENTS):
        if i % 2 == 0:
            jobs.append(("/generate", native_body(i, 16), None))
        elif i % 4 == 1:
            jobs.append(("/generate", native_body(i, HANG_UP_TOKENS), 1))
        else:
            jobs.append(("/v1/chat/completions", chat_body(i, HANG_UP_TOKENS), 1))
    results = asyncio.run(run_clients(server.url, jobs))
    for events in results[::2]:
        assert events[-1] == "[DONE]"
        assert not any('"error"' in e for e in events)
        assert '"length": 16' in events[-2]
    assert all(len(events) == 1 for events in results[1::2])
    after = idle_metrics(engine, timeout=20)
    assert len(aborted) == NUM_CLIENTS // 2
    assert after["num_running"] == 0 and after["num_waiting"] == 0
    assert after["num_finished"]["abort"] - before["num_finished"]["abort"] == NUM_CLIENTS // 2
    assert after["num_finished"]["length"] - before["num_finished"]["length"] == NUM_CLIENTS // 2
    assert after["kv_free"] + after["cache_evictable"] == after["kv_capacity"]
    with httpx.Client(base_url=server.url) as client:
        ok = client.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})
        assert ok.status_code == 200


def test_a_non_streaming_client_that_hangs_up_is_aborted(
    server, idle_metrics, step_gate, monkeypatch
):
    """The engine is held after the prefill until the server has aborted all four requests:
    they cannot finish before the client's read timeout, however fast this CPU is."""
    engine = server.engine
    before = idle_metrics(engine)
    gate = step_gate(engine, free=1)  # the prefill: each prompt's first token
    aborted = release_after_aborts(engine, monkeypatch, 4, gate.release)
    body = {
        "text": ["The lazy dog"] * 4,
        "sampling_params": {"max_new_tokens": 480, "ignore_eos": True},
    }
    timeout = httpx.Timeout(60, read=0.3)  # no answer within 0.3 s: the client hangs up
    with httpx.Client(base_url=server.url, timeout=timeout) as client:
        with pytest.raises(httpx.ReadTimeout):
            client.post("/generate", json=body)
    after = idle_metrics(engine, timeout=20)
    assert len(aborted) == 4
    assert after["num_finished"]["abort"] - before["num_finished"]["abort"] == 4
    assert after["num_finished"]["length"] == before["num_finished"]["length"]
