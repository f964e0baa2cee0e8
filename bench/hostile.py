"""Hostile requests against a real `stemma serve`: each one from hostile_corpus.py is sent
beside a victim request while /health is polled every 0.2 s; recorded per request are its
status, the victim's, the slowest /health answer and the server's RSS growth.

  python -m stemma.bench.hostile                     # the built-in model, 3 rounds
  python -m stemma.bench.hostile --model DIR --rounds 5

The server runs under an address-space limit, so a request that makes it allocate without
bound fails with the server instead of the machine. Targets: every status as stated, the
victim answers 200, /health never slower than 0.5 s, RSS growth under 100 MB.
tests/server/test_hostile.py runs the same probe on a tiny model and asserts all of it but
the latency, which it bounds only as a hang (a test never bets on this CPU's speed).
"""

from __future__ import annotations

import argparse
import resource
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from .hostile_corpus import HostileRequest, hostile_requests

HEALTH_PERIOD_S = 0.2
HEALTH_TARGET_S = 0.5
RSS_TARGET_MB = 100
# Far above what a small model's server maps (about 3 GB of address space, most of it
# reserved and untouched), far below the machine's memory.
ADDRESS_SPACE_LIMIT = 8 << 30
API_KEY = "hostile-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
VICTIM_TOKENS = 8
VICTIM = {
    "text": "The victim says",
    "sampling_params": {"max_new_tokens": VICTIM_TOKENS, "temperature": 0},
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class HostileServer:
    """`python -m stemma serve` under an API key, its address space limited."""

    def __init__(self, model: str, log_path: Path, extra: list[str] | None = None) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        command = [sys.executable, "-m", "stemma", "serve", "--model", model, "--num-threads", "1"]
        command += ["--port", self.url.rsplit(":", 1)[1], "--served-model-name", "hostile"]
        command += ["--api-key", API_KEY, *(extra or [])]
        self.log_path = log_path
        with open(log_path, "w") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_limit_memory
            )
        deadline = time.monotonic() + 300
        while True:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not come up:\n{self.tail()}")
            try:
                httpx.get(f"{self.url}/health", timeout=1).raise_for_status()
                return
            except httpx.HTTPError:
                time.sleep(0.2)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("the server process has no VmRSS")

    def tail(self) -> str:
        return self.log_path.read_text()[-3000:]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))


class HealthPoller:
    """GET /health every HEALTH_PERIOD_S on its own thread; keeps the slowest answer."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.slowest_s = 0.0
        self.num_polls = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                start = time.monotonic()
                try:
                    status = client.get(f"{self.url}/health").status_code
                    if status != 200:
                        self.failures.append(f"/health answered {status}")
                except httpx.HTTPError as e:
                    self.failures.append(f"/health failed: {e!r}")
                self.slowest_s = max(self.slowest_s, time.monotonic() - start)
                self.num_polls += 1
                self._stop.wait(HEALTH_PERIOD_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


@dataclass(slots=True)
class Probe:
    """What one hostile request did to the server."""

    name: str
    status: int
    body: str
    victim_status: int | None
    victim_tokens: int | None
    server_alive: bool
    health_failures: list[str]
    slowest_health_s: float
    rss_growth_mb: float

    def problems(self, case: HostileRequest, health_bound_s: float) -> list[str]:
        """Every way this probe missed its case's statuses or a target; empty when none."""
        out = []
        if not self.server_alive:
            out.append("the server died")
        if self.status not in case.statuses:
            out.append(f"HTTP {self.status}, expected {case.statuses}: {self.body[:300]}")
        elif self.status >= 400 and '"error"' not in self.body and '"detail"' not in self.body:
            out.append(f"a {self.status} without a JSON error: {self.body[:300]}")
        if (self.victim_status, self.victim_tokens) != (200, VICTIM_TOKENS):
            out.append(f"the victim got {self.victim_status} with {self.victim_tokens} tokens")
        out += self.health_failures[:3]
        if self.slowest_health_s > health_bound_s:
            out.append(f"/health took {self.slowest_health_s:.2f} s (bound {health_bound_s})")
        if self.rss_growth_mb >= RSS_TARGET_MB:
            out.append(f"RSS grew {self.rss_growth_mb:.0f} MB")
        return out


def probe(server: HostileServer, case: HostileRequest) -> Probe:
    """Send `case` beside a victim request, /health polled throughout."""
    rss_before = server.rss_mb()
    poller = HealthPoller(server.url)
    victim: dict[str, Any] = {}

    def run_victim() -> None:
        r = httpx.post(f"{server.url}/generate", json=VICTIM, headers=AUTH, timeout=120)
        victim["status"] = r.status_code
        if r.status_code == 200:
            victim["tokens"] = r.json()["meta_info"]["completion_tokens"]

    victim_thread = threading.Thread(target=run_victim)
    victim_thread.start()
    headers = AUTH if case.authorization is None else {"Authorization": case.authorization}
    try:
        r = httpx.post(server.url + case.path, json=case.body, headers=headers, timeout=120)
        status, body = r.status_code, r.text
    except httpx.HTTPError as e:
        status, body = 0, repr(e)
    finally:
        victim_thread.join(timeout=120)
        poller.stop()
    alive = server.process.poll() is None
    return Probe(
        case.name,
        status,
        body[:2000],
        victim.get("status"),
        victim.get("tokens"),
        alive,
        poller.failures,
        round(poller.slowest_s, 4),
        round(server.rss_mb() - rss_before, 1) if alive else float("inf"),
    )


def warm_up(server: HostileServer) -> None:
    r = httpx.post(f"{server.url}/generate", json=VICTIM, headers=AUTH, timeout=120)
    r.raise_for_status()


def main(argv: list[str] | None = None) -> int:
    from .common import append_results, print_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("/tmp/stemma-hostile"))
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    server = HostileServer(args.model, args.out / "serve.log")
    cases = hostile_requests("hostile")
    worst: dict[str, Probe] = {}
    num_problems: dict[str, int] = {c.name: 0 for c in cases}
    try:
        warm_up(server)
        for _ in range(args.rounds):
            for case in cases:
                p = probe(server, case)
                num_problems[case.name] += bool(p.problems(case, HEALTH_TARGET_S))
                if case.name not in worst or p.slowest_health_s > worst[case.name].slowest_health_s:
                    worst[case.name] = p
    finally:
        server.stop()
    rows = [
        {
            "case": name,
            "status": p.status,
            "victim_status": p.victim_status,
            "slowest_health_s": p.slowest_health_s,
            "rss_growth_mb": p.rss_growth_mb,
            "rounds_missing_a_target": num_problems[name],
            "rounds": args.rounds,
        }
        for name, p in worst.items()
    ]
    print_table(rows, list(rows[0]))
    if not args.no_record:
        append_results("hostile", [r | {"model": args.model} for r in rows])
    return 1 if any(num_problems.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
