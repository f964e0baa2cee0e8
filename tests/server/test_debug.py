"""The debug routes: KV memory by owner (always on), and fault switches (404 unless enabled;
with them on, an injected forward error fails its request with a message and the server goes
on serving)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from stemma.runtime.engine import Engine
from stemma.runtime.server.app import create_app

from .conftest import LiveServer

REQ = {"text": "a b c", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}


@pytest.fixture(scope="module")
def faulty_server(tiny_llama_dir: Path) -> Iterator[LiveServer]:
    engine = Engine(
        str(tiny_llama_dir), dtype="float32", max_total_tokens=2048, enable_fault_injection=True
    )
    live = LiveServer(create_app(engine), engine)
    yield live
    live.stop()
    engine.shutdown()


def test_memory_reports_slots_by_owner(server: LiveServer, idle_metrics) -> None:
    assert httpx.post(f"{server.url}/generate", json=REQ).status_code == 200
    idle_metrics(server.engine)
    state = httpx.get(f"{server.url}/debug/memory").json()
    assert state["invariant_ok"] and state["violation"] is None
    owners = state["free"] + state["evictable"] + state["locked"] + state["private"]
    assert owners == state["capacity"] and state["private"] == 0
    assert state["rows_free"] == state["rows_total"] and state["active"] == 0


def test_fault_switches_are_404_when_off(server: LiveServer) -> None:
    r = httpx.post(f"{server.url}/debug/inject_fault", json={"kind": "forward_error"})
    assert r.status_code == 404
    assert "--enable-fault-injection" in r.json()["error"]["message"]


def test_injected_forward_error_is_a_request_error_and_the_server_goes_on(
    faulty_server: LiveServer,
) -> None:
    url = faulty_server.url
    r = httpx.post(f"{url}/debug/inject_fault", json={"kind": "nope"})
    assert r.status_code == 400 and "unknown fault" in r.json()["error"]["message"]
    armed = httpx.post(f"{url}/debug/inject_fault", json={"kind": "forward_error"}).json()
    assert armed["armed"] == {"forward_error": 1}
    failed = httpx.post(f"{url}/generate", json=REQ).json()
    assert failed["meta_info"]["finish_reason"]["type"] == "abort"
    assert "injected fault" in failed["meta_info"]["finish_reason"]["message"]
    ok = httpx.post(f"{url}/generate", json=REQ).json()
    assert ok["meta_info"]["finish_reason"]["type"] == "length"
    assert httpx.get(f"{url}/debug/memory").json()["invariant_ok"]
