"""Soak: `stemma serve` under hostile load for a set time, with faults injected; then checks.

  python -m stemma.bench.soak                       # 30 minutes (the default profile)
  python -m stemma.bench.soak --profile ci          # 2 minutes
  python -m stemma.bench.soak --minutes 60 --seed 7 --concurrency 12

The server runs as a subprocess with the default engine config except a KV pool small enough
that retraction happens every minute, a 5 s compile limit, and the test-only fault switches
on. `--concurrency` clients draw scenarios from a seeded mix (soak_traffic.py: streaming and
plain /generate and chat, batches, n > 1, regex / JSON-schema / tool calls, pathological
constraints, forked DSL programs, disconnects, aborts, cache flushes, malformed and over-long
bodies, clients that never read). Every `--fault-every` seconds one fault fires in turn: a
model forward raises, the compile worker is killed mid-compile, the compile worker hangs.

Watched every 10 s: the slot invariant (GET /debug/memory), the server's RSS and its
children's, /health. At the end: every slot free, the cache flushes to an empty pool, a token
generates; then SIGTERM with requests in flight: each ends (finished or with an error), the
server exits 0 within its grace time and leaves no child process.

Results: one summary line in bench/results/soak.jsonl, the time series in
bench/results/soak_<profile>_series.json, and a plot in bench/results/soak_<profile>.png.
Exit status 1 if any check failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .common import RESULTS_DIR, append_results
from .soak_traffic import EXPECTED_ERRORS, Outcome, Traffic

PROFILES = {"default": 30.0, "ci": 2.0}
SAMPLE_EVERY_S = 10.0
RSS_JUDGED_MINUTES = 10.0
FAULTS = ("forward_error", "compile_kill", "compile_hang")


@dataclass
class Record:
    """Everything the run saw, for the checks and the plot."""

    start: float = field(default_factory=time.monotonic)
    outcomes: Counter[str] = field(default_factory=Counter)
    by_scenario: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    latency: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    bad: list[dict[str, Any]] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)  # expected errors, by message
    samples: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)

    def add(self, scenario: str, outcome: Outcome, seconds: float) -> None:
        self.outcomes[outcome.status] += 1
        self.by_scenario[scenario][outcome.status] += 1
        self.latency[scenario].append(seconds)
        if outcome.status == "error":
            self.errors[re.sub(r"\d+", "N", f"{scenario}: {outcome.detail[:90]}")] += 1
        if outcome.status in ("bad", "hung") and len(self.bad) < 50:
            self.bad.append(
                {
                    "t": self.now(),
                    "scenario": scenario,
                    "status": outcome.status,
                    "detail": outcome.detail,
                }
            )

    def now(self) -> float:
        return round(time.monotonic() - self.start, 1)


# ---- the server process ------------------------------------------------------------------
def start_server(port: int, kv_tokens: int, log_path: Path, extra: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "stemma", "serve", "--port", str(port)]
    cmd += ["--max-total-tokens", str(kv_tokens), "--grammar-timeout-s", "5"]
    cmd += ["--enable-fault-injection", "--graceful-timeout", "10", "--log-level", "warning"]
    log = open(log_path, "w")  # noqa: SIM115 - the child writes it for the run's length
    proc = subprocess.Popen(cmd + extra, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}; see {log_path}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("the server did not become healthy within 300 s")


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def child_pids(pid: int) -> list[int]:
    pids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return pids


# ---- the load ----------------------------------------------------------------------------
async def client_loop(traffic: Traffic, rec: Record, until: float, deadline_s: float) -> None:
    while time.monotonic() < until:
        name, scenario = traffic.pick()
        t = time.monotonic()
        try:
            outcome = await asyncio.wait_for(scenario(), deadline_s)
        except TimeoutError:
            outcome = Outcome("hung", f"no answer within {deadline_s:g} s")
        except httpx.HTTPError as e:
            outcome = Outcome("bad", f"transport error: {type(e).__name__}: {e}"[:200])
        except Exception as e:  # noqa: BLE001 - a malformed answer the scenario tripped on
            outcome = Outcome("bad", f"{type(e).__name__}: {e}"[:200])
        rec.add(name, outcome, time.monotonic() - t)


async def sampler(client: httpx.AsyncClient, url: str, pid: int, rec: Record, until: float) -> None:
    while time.monotonic() < until:
        sample: dict[str, Any] = {"t": rec.now(), "rss_mb": rss_mb(pid)}
        sample["children_rss_mb"] = sum(rss_mb(c) for c in child_pids(pid))
        t = time.monotonic()
        try:
            health = await client.get(f"{url}/health", timeout=5)
            sample["health"] = health.status_code
        except httpx.HTTPError as e:
            sample["health"] = f"{type(e).__name__}"
        sample["health_s"] = round(time.monotonic() - t, 3)
        try:
            sample["memory"] = (await client.get(f"{url}/debug/memory", timeout=10)).json()
            info = (await client.get(f"{url}/get_server_info", timeout=10)).json()
            sample["retractions"] = info["internal_states"][0]["num_retractions"]
        except (httpx.HTTPError, ValueError, KeyError) as e:
            sample["memory"] = {"error": f"{type(e).__name__}: {e}"}
        rec.samples.append(sample)
        if len(rec.samples) % 6 == 1:  # progress about once a minute
            o = rec.outcomes
            print(
                f"  {sample['t'] / 60:5.1f} min  ok {o['ok']}  error {o['error']}  bad {o['bad']}"
                f"  hung {o['hung']}  rss {sample['rss_mb']:.0f} MiB  faults {len(rec.faults)}",
                flush=True,
            )
        await asyncio.sleep(SAMPLE_EVERY_S)


async def injector(traffic: Traffic, rec: Record, every_s: float, until: float) -> None:
    """One fault per period, in turn; the compile faults then send a never-seen regex, so a
    compile really runs while the switch is armed."""
    i = 0
    while time.monotonic() + every_s < until:
        await asyncio.sleep(every_s)
        kind = FAULTS[i % len(FAULTS)]
        i += 1
        r = await traffic.client.post(f"{traffic.url}/debug/inject_fault", json={"kind": kind})
        entry: dict[str, Any] = {"t": rec.now(), "kind": kind, "armed": r.status_code == 200}
        if kind != "forward_error":
            unique = f"soak{i}x{random.randrange(1 << 30)}"
            params = {"max_new_tokens": 24, "regex": f"{unique}-[a-z]{{1,8}}"}
            t = time.monotonic()
            g = await traffic.client.post(
                f"{traffic.url}/generate", json={"text": "go", "sampling_params": params}
            )
            entry |= {"probe_status": g.status_code, "probe_s": round(time.monotonic() - t, 2)}
            body = g.json()
            entry["probe"] = body.get("text") if g.status_code == 200 else body.get("error")
        rec.faults.append(entry)


async def run_load(args: argparse.Namespace, url: str, pid: int, rec: Record) -> None:
    until = time.monotonic() + args.minutes * 60
    limits = httpx.Limits(max_connections=args.concurrency * 3 + 8)
    async with httpx.AsyncClient(timeout=args.deadline, limits=limits) as client:
        rngs = [random.Random(args.seed * 1000 + i) for i in range(args.concurrency)]
        model = (await client.get(f"{url}/get_model_info")).json()["served_model_name"]
        traffics = [Traffic(client, url, rng, model) for rng in rngs]
        tasks = [client_loop(t, rec, until, args.deadline) for t in traffics]
        tasks.append(sampler(client, url, pid, rec, until))
        tasks.append(injector(traffics[0], rec, args.fault_every, until))
        await asyncio.gather(*tasks)


# ---- after the load ----------------------------------------------------------------------
def settle(url: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """Wait until nothing runs or waits; the memory state then, and after a cache flush."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = httpx.get(f"{url}/debug/memory", timeout=10).json()
        if (state["running"] == state["waiting"] == state["active"] == 0) or (
            time.monotonic() > deadline
        ):
            break
        time.sleep(0.5)
    flushed = httpx.post(f"{url}/flush_cache", timeout=30)
    after = httpx.get(f"{url}/debug/memory", timeout=10).json()
    health = httpx.get(f"{url}/health_generate", timeout=60).status_code
    leaked = state["capacity"] - state["free"] - state["evictable"]
    return {
        "idle": state,
        "leaked_slots": leaked,
        "flush_status": flushed.status_code,
        "free_after_flush": after["free"],
        "capacity": after["capacity"],
        "rows_leaked": state["rows_total"] - state["rows_free"],
        "health_generate": health,
    }


async def sigterm_phase(url: str, proc: subprocess.Popen, grace_s: float) -> dict[str, Any]:
    """SIGTERM with 8 requests in flight: each must end, with a result or an error."""
    children = child_pids(proc.pid)
    async with httpx.AsyncClient(timeout=grace_s + 30) as client:

        async def one(i: int) -> str:
            body = {
                "text": f"request {i} " * 20,
                "sampling_params": {"max_new_tokens": 400, "ignore_eos": True},
                "stream": i % 2 == 0,
            }
            try:
                r = await client.post(f"{url}/generate", json=body)
            except httpx.HTTPError as e:
                return f"transport: {type(e).__name__}"
            if r.status_code != 200:
                return "error" if "error" in r.text else f"bad HTTP {r.status_code}"
            if body["stream"]:
                lines = [x for x in r.text.splitlines() if x.startswith("data:")]
                if not lines or lines[-1] != "data: [DONE]":
                    return "bad: stream cut"
                return "error" if '"error"' in lines[-2] else "finished"
            finish = r.json()["meta_info"]["finish_reason"]
            return "error" if finish["type"] == "abort" else "finished"

        requests = [asyncio.create_task(one(i)) for i in range(8)]
        await asyncio.sleep(2.0)
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        ends = await asyncio.gather(*requests)
    try:
        code = await asyncio.to_thread(proc.wait, grace_s + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = "killed: did not exit"
    orphans = [c for c in children if os.path.exists(f"/proc/{c}")]
    return {
        "request_ends": dict(Counter(ends)),
        "exit_code": code,
        "exit_s": round(time.monotonic() - t, 1),
        "orphans": orphans,
    }


# ---- verdict -----------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def verdict(args: argparse.Namespace, rec: Record, end: dict[str, Any], term: dict[str, Any]):
    samples = rec.samples
    # RSS growth counts from 5 minutes in: the first minutes grow the allocator's pools and
    # the caches (about 1.1 -> 1.5 GiB here), so a run shorter than RSS_JUDGED_MINUTES
    # records its growth without judging it.
    warm_t = min(300.0, args.minutes * 60 / 6)
    warm = [s["rss_mb"] for s in samples if s["t"] >= warm_t][:3]
    last = [s["rss_mb"] for s in samples][-3:]
    base = statistics.median(warm) if warm else 0.0
    growth = (statistics.median(last) - base) / base if base else 0.0
    violations = [s for s in samples if not s["memory"].get("invariant_ok", False)]
    unhealthy = [s for s in samples if s["health"] != 200]
    fault_kinds = {f["kind"] for f in rec.faults if f["armed"]}
    checks = {
        "no_invariant_violation": not violations,
        "no_leaked_slots": end["leaked_slots"] == 0 and end["rows_leaked"] == 0,
        "flush_empties_pool": end["free_after_flush"] == end["capacity"],
        "rss_growth_under_5pct": growth < 0.05 if args.minutes >= RSS_JUDGED_MINUTES else None,
        "no_hung_request": rec.outcomes["hung"] == 0,
        "no_bad_response": rec.outcomes["bad"] == 0,
        "healthy_throughout": not unhealthy and end["health_generate"] == 200,
        "every_fault_fired": fault_kinds == set(FAULTS) or args.minutes * 60 < 3 * args.fault_every,
        "retraction_happened": max((s.get("retractions", 0) for s in samples), default=0) > 0,
        "sigterm_clean": term["exit_code"] == 0
        and not term["orphans"]
        and not any(k.startswith(("bad", "transport")) for k in term["request_ends"]),
    }
    latency = {
        name: {
            "n": len(v),
            "p50_s": round(percentile(v, 0.5), 3),
            "p99_s": round(percentile(v, 0.99), 3),
        }
        for name, v in sorted(rec.latency.items())
    }
    summary = {
        "workload": f"soak {args.profile} {args.minutes:g} min",
        "minutes": args.minutes,
        "seed": args.seed,
        "concurrency": args.concurrency,
        "kv_tokens": args.kv_tokens,
        "passed": all(v is not False for v in checks.values()),  # None: not judged
        "checks": checks,
        "outcomes": dict(rec.outcomes),
        "by_scenario": {k: dict(v) for k, v in sorted(rec.by_scenario.items())},
        "errors": dict(rec.errors.most_common(30)),
        "latency": latency,
        "rss_mb_at_warm": round(base, 1),
        "rss_mb_end": round(statistics.median(last), 1) if last else 0.0,
        "rss_growth": round(growth, 4),
        "retractions": max((s.get("retractions", 0) for s in samples), default=0),
        "invariant_violations": [s["memory"] for s in violations][:5],
        "unhealthy_samples": len(unhealthy),
        "faults": rec.faults,
        "end": end,
        "sigterm": term,
        "bad_examples": rec.bad[:20],
        "expected_error_markers": list(EXPECTED_ERRORS),
    }
    return summary


def plot(rec: Record, path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'stemma-lm[bench]'): no plot")
        return
    t = [s["t"] / 60 for s in rec.samples]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    ax1.plot(t, [s["rss_mb"] for s in rec.samples], label="server RSS")
    ax1.plot(t, [s["children_rss_mb"] for s in rec.samples], label="compile workers' RSS")
    ax1.set_ylabel("MiB")
    ax1.legend(loc="upper left")
    for f in rec.faults:
        ax1.axvline(f["t"] / 60, color="red", alpha=0.3, lw=1)
    mem = [s["memory"] for s in rec.samples]
    ax2.plot(t, [m.get("free", 0) for m in mem], label="free slots")
    ax2.plot(t, [m.get("evictable", 0) for m in mem], label="evictable")
    ax2.plot(t, [m.get("private", 0) + m.get("locked", 0) for m in mem], label="in use")
    ax2.set_xlabel("minutes (red lines: injected faults)")
    ax2.set_ylabel("KV slots")
    ax2.legend(loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--profile", choices=sorted(PROFILES), default="default")
    p.add_argument("--minutes", type=float, default=None, help="default: the profile's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--kv-tokens", type=int, default=640, help="KV pool slots (small: retraction)")
    p.add_argument("--fault-every", type=float, default=None, help="s; default minutes*60/12")
    p.add_argument("--deadline", type=float, default=180.0, help="s a request may take")
    p.add_argument("--port", type=int, default=31977)
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    p.add_argument("--no-record", action="store_true", help="do not append to soak.jsonl")
    p.add_argument("--server-args", default="", help="more `stemma serve` flags")
    args = p.parse_args(argv)
    args.minutes = args.minutes if args.minutes is not None else PROFILES[args.profile]
    args.fault_every = args.fault_every or max(10.0, args.minutes * 60 / 12)
    args.out.mkdir(parents=True, exist_ok=True)
    log_path = args.out / f"soak_{args.profile}_server.log"
    proc = start_server(args.port, args.kv_tokens, log_path, args.server_args.split())
    url = f"http://127.0.0.1:{args.port}"
    rec = Record()
    print(f"soak: {args.minutes:g} min, {args.concurrency} clients, seed {args.seed}, {url}")
    try:
        asyncio.run(run_load(args, url, proc.pid, rec))
        end = settle(url)
        term = asyncio.run(sigterm_phase(url, proc, 10.0))
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = verdict(args, rec, end, term)
    series = args.out / f"soak_{args.profile}_series.json"
    series.write_text(json.dumps({"samples": rec.samples, "faults": rec.faults}, indent=1))
    plot(rec, args.out / f"soak_{args.profile}.png", summary["workload"])
    if not args.no_record:
        append_results("soak", [summary])
    print(
        json.dumps(
            {
                k: summary[k]
                for k in ("passed", "checks", "outcomes", "errors", "retractions", "rss_growth")
            },
            indent=1,
        )
    )
    for bad in summary["bad_examples"]:
        print("BAD", bad)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
