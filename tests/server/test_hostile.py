"""Hostile requests against a real `stemma serve` process: each one gets a 4xx JSON answer
(or a normal 200 where the input is legal) while /health, polled every 0.2 s, keeps answering
within 0.5 s, a victim request beside it succeeds, and the server's RSS grows by less than
100 MB. The server runs under an address-space limit, so a regression that makes one of
these requests allocate without bound fails this test instead of the machine."""

from __future__ import annotations

import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from stemma.bench.hostile_corpus import HostileRequest, hostile_requests

from .test_cli import free_port

HEALTH_PERIOD_S = 0.2
HEALTH_BOUND_S = 0.5
RSS_BOUND_MB = 100
# Far above what the tiny model's server maps (about 3 GB of address space, most of it
# reserved and untouched), far below what the machine has.
ADDRESS_SPACE_LIMIT = 8 << 30
API_KEY = "hostile-test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
VICTIM = {"text": "The victim says", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}


CASES = hostile_requests("tiny")


class Server:
    """`python -m stemma serve` on the tiny model, its address space limited."""

    def __init__(self, model_dir: Path, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "stemma", "serve", "--model", str(model_dir)]
        command += ["--port", str(self.port), "--dtype", "float32", "--num-threads", "1"]
        command += ["--max-total-tokens", "8192", "--served-model-name", "tiny"]
        command += ["--api-key", API_KEY]
        self.log_path = log_path
        with open(log_path, "w") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_limit_memory
            )
        deadline = time.monotonic() + 120
        while True:
            assert self.process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "the server did not come up"
            try:
                httpx.get(f"{self.url}/health", timeout=1).raise_for_status()
                return
            except httpx.HTTPError:
                time.sleep(0.2)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("the server process has no VmRSS")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))


class HealthPoller:
    """GET /health every HEALTH_PERIOD_S on its own thread; keeps the slowest answer."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.slowest_s = 0.0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                start = time.monotonic()
                try:
                    status = client.get(f"{self.url}/health").status_code
                    if status != 200:
                        self.failures.append(f"/health answered {status}")
                except httpx.HTTPError as e:
                    self.failures.append(f"/health failed: {e!r}")
                self.slowest_s = max(self.slowest_s, time.monotonic() - start)
                self._stop.wait(HEALTH_PERIOD_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


@pytest.fixture(scope="module")
def hostile_server(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    server = Server(tiny_llama_dir, tmp_path_factory.mktemp("hostile") / "serve.log")
    warm = httpx.post(f"{server.url}/generate", json=VICTIM, headers=AUTH, timeout=60)
    assert warm.status_code == 200, warm.text
    yield server
    server.stop()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_request_is_refused_alone(hostile_server: Server, case: HostileRequest) -> None:
    url = hostile_server.url
    rss_before = hostile_server.rss_mb()
    poller = HealthPoller(url)
    victim: dict[str, Any] = {}

    def run_victim() -> None:
        response = httpx.post(f"{url}/generate", json=VICTIM, headers=AUTH, timeout=60)
        victim["status"], victim["body"] = response.status_code, response.json()

    victim_thread = threading.Thread(target=run_victim)
    victim_thread.start()
    try:
        headers = AUTH if case.authorization is None else {"Authorization": case.authorization}
        response = httpx.post(url + case.path, json=case.body, headers=headers, timeout=60)
    finally:
        victim_thread.join(timeout=60)
        poller.stop()
    assert hostile_server.process.poll() is None, hostile_server.log_path.read_text()[-2000:]
    assert response.status_code in case.statuses, response.text[:500]
    if response.status_code >= 400:
        assert "error" in response.json() or "detail" in response.json(), response.text[:500]
    assert victim.get("status") == 200, victim
    assert victim["body"]["meta_info"]["completion_tokens"] == 8
    assert not poller.failures, poller.failures[:3]
    assert poller.slowest_s <= HEALTH_BOUND_S, f"/health took {poller.slowest_s:.2f} s"
    assert hostile_server.rss_mb() - rss_before < RSS_BOUND_MB
