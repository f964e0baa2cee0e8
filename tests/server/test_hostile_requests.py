"""One hostile request must not take the server down: a catastrophic stop regex runs in
linear time, a stream nobody reads stays bounded, a full queue refuses with 429, and
batches and aborts cost what their size says."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import httpx
import pytest
from stemma.runtime.engine import Engine
from stemma.runtime.engine_state import EventBuffer, QueueFull

from .conftest import wait_until_idle

GREEDY = {"temperature": 0, "ignore_eos": True}

# (route, body, status, words the error message must contain): the lead's shared table.
HOSTILE_CASES: list[tuple[str, dict[str, Any], int, str]] = [
    ("/generate", {"text": "hi", "sampling_params": {"n": 100_000}}, 400, "--max-request-items"),
    ("/generate", {"text": ["hi"] * 1025}, 400, "--max-request-items"),
    ("/generate", {"input_ids": [[5]] * 1025}, 400, "--max-request-items"),
    ("/v1/completions", {"prompt": ["hi"] * 1025}, 400, "--max-request-items"),
    ("/v1/completions", {"prompt": ["hi"] * 20, "n": 64}, 400, "--max-request-items"),
    ("/generate", {"text": "x", "sampling_params": {"stop_regex": r"(a)\1"}}, 400, "(a)\\\\1"),
    ("/generate", {"text": "x", "sampling_params": {"stop_regex": "(?<=a)b"}}, 400, "lookaround"),
    ("/generate", {"text": "x", "sampling_params": {"stop_regex": "a$"}}, 400, "end anchors"),
    (
        "/generate",
        {"text": "x", "sampling_params": {"stop_regex": "(a{1000}){1000}"}},
        400,
        "--max-stop-regex-states",
    ),
]


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.mark.parametrize(("route", "body", "status", "words"), HOSTILE_CASES)
def test_hostile_request_is_refused_and_the_server_serves_on(client, route, body, status, words):
    r = client.post(route, json=body)
    assert r.status_code == status, r.text
    assert words in r.json()["error"]["message"]
    ok = client.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}})
    assert ok.status_code == 200


def _in_thread(fn, timeout: float = 120.0) -> Any:
    """fn() on a thread; fails (rather than hangs) if it has not returned by `timeout`."""
    box: list[Any] = []
    worker = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    worker.start()
    worker.join(timeout)
    assert not worker.is_alive(), "the request did not finish: the engine is stuck"
    return box[0]


@pytest.mark.parametrize(
    ("stop_regex", "text", "matched"),
    [
        ("(a+)+b", "x" + "a" * 40, None),  # never matches: exponential for a backtracker
        ("(a+)+a{9}", "x", "a" * 10),  # matches as the tenth a arrives
    ],
)
def test_nested_quantifier_stop_regex_over_forced_text(tiny_engine, stop_regex, text, matched):
    params = {"regex": "xa{40}", "stop_regex": stop_regex, "max_new_tokens": 64, **GREEDY}
    out = _in_thread(lambda: tiny_engine.generate("hi", params))
    assert out["text"] == text
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": matched}


def test_stop_string_and_regex_cut_where_the_first_match_ends(tiny_engine):
    free = tiny_engine.generate("hi", {"regex": "xyzzy[0-9]{5}", **GREEDY})["text"]
    digits = free[len("xyzzy") :]
    params = {"regex": "xyzzy[0-9]{5}", **GREEDY, "stop": [digits[1:3]], "stop_regex": "y+"}
    out = tiny_engine.generate("hi", params)
    assert out["text"] == "x"
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "y"}


def test_event_buffer_keeps_finals_and_only_the_latest_progress() -> None:
    buf = EventBuffer()
    for k in range(1000):
        buf.put((0, {"text": "a" * k}, False))
        buf.put((1, {"text": "b" * k}, False))
    assert len(buf) == 2 and buf.num_coalesced == 2 * 999
    buf.put((1, {"text": "done"}, True))
    assert len(buf) == 2  # the final replaced item 1's queued progress
    assert buf.get() == (0, {"text": "a" * 999}, False)
    assert buf.get() == (1, {"text": "done"}, True)
    assert buf.get_nowait() is None


def test_a_stream_nobody_reads_stays_bounded_and_ends_complete(tiny_engine):
    params = {"max_new_tokens": 48, **GREEDY}
    expected = tiny_engine.generate("hi", params)
    before = sum(tiny_engine.get_metrics()["num_finished"].values())
    stream = tiny_engine.generate("hi", params, stream=True)
    first = next(stream)  # submitted; now the caller stops reading while 47 tokens generate
    assert len(first["output_ids"]) < 48
    wait_until_idle(tiny_engine)
    assert sum(tiny_engine.get_metrics()["num_finished"].values()) == before + 1
    rest = list(stream)
    assert len(rest) <= 2  # one coalesced progress event and the final one
    assert rest[-1]["text"] == expected["text"]
    assert rest[-1]["output_ids"] == expected["output_ids"]


def test_an_async_stream_nobody_reads_stays_bounded(tiny_engine):
    params = {"max_new_tokens": 48, **GREEDY}
    expected = tiny_engine.generate("hi", params)

    async def lagging() -> list[dict[str, Any]]:
        stream = await tiny_engine.async_generate("hi", params, stream=True)
        chunks = [await anext(stream)]
        await asyncio.to_thread(wait_until_idle, tiny_engine)
        return chunks + [c async for c in stream]

    chunks = asyncio.run(lagging())
    assert len(chunks) <= 3
    assert chunks[-1]["text"] == expected["text"]


def test_over_max_queued_requests_is_a_429_naming_the_flag(tiny_engine, client, monkeypatch):
    capped = dataclasses.replace(tiny_engine.config, max_queued_requests=2)
    monkeypatch.setattr(tiny_engine, "config", capped)
    with pytest.raises(QueueFull, match="--max-queued-requests"):
        tiny_engine.generate(["a", "b", "c"], {"max_new_tokens": 1})
    r = client.post("/generate", json={"text": ["a", "b", "c"]})
    assert r.status_code == 429
    error = r.json()["error"]
    assert "the limit is 2 (--max-queued-requests)" in error["message"]
    assert error["code"] == "max_queued_requests"
    assert client.post("/generate", json={"text": ["a", "b"]}).status_code == 200


def test_aborting_a_large_queue_keeps_the_rest_in_order(tiny_llama_dir, harness_factory):
    h = harness_factory(tiny_llama_dir, max_running_requests=1)
    reqs = [h.add(f"r{i}", [5, 6, 7], max_new_tokens=2) for i in range(300)]
    done = h.scheduler.abort_many({f"r{i}": "gone" for i in range(0, 300, 2)})
    assert sorted(r.rid for r in done) == sorted(f"r{i}" for i in range(0, 300, 2))
    assert all(r.finish.message == "gone" for r in done)
    assert h.scheduler.waiting == reqs[1::2]
    h.run()
    assert all(r.finish.kind == "length" for r in reqs[1::2])


def test_engine_refuses_a_stop_regex_without_a_linear_automaton(tiny_engine: Engine):
    with pytest.raises(ValueError, match="lookaround"):
        tiny_engine.generate("hi", {"stop_regex": "(?=a)b"})


def test_a_stream_never_shows_a_stop_string_that_may_be_starting(tiny_engine):
    params = {"regex": "xyzzy[0-9]{5}", "stop": ["zzy", "q"], **GREEDY}
    chunks = list(tiny_engine.generate("hi", params, stream=True))
    assert all("xy".startswith(c["text"]) for c in chunks)
    assert chunks[-1]["text"] == "xy"
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": "zzy"}


def test_catastrophic_stop_regex_over_http_answers_and_the_server_serves_on(client):
    body = {
        "text": "hi",
        "sampling_params": {"regex": "xa{40}", "stop_regex": "(a+)+b", "max_new_tokens": 64},
    }
    r = client.post("/generate", json=body)  # the client's 60 s timeout fails a stuck engine
    assert r.status_code == 200, r.text
    assert r.json()["text"] == "x" + "a" * 40
    ok = client.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}})
    assert ok.status_code == 200
