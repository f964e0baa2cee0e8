"""Soak: `stemma serve` under hostile load for a set time, with faults injected; then checks.

  python -m stemma.bench.soak                       # 30 minutes (the default profile)
  python -m stemma.bench.soak --profile ci          # 2 minutes
  python -m stemma.bench.soak --minutes 60 --seed 7 --concurrency 12

The server runs as a subprocess with the default engine config except a KV pool small enough
that retraction happens every minute, a 5 s compile limit, and the test-only fault switches
on. `--concurrency` clients draw scenarios from a seeded mix (soak_traffic.py: streaming and
plain /generate and chat, batches, n > 1, regex / JSON-schema / tool calls, pathological
constraints, the hostile requests of hostile_corpus.py (each must get its stated status),
forked DSL programs, disconnects, aborts, cache flushes, malformed and over-long bodies,
clients that never read). Every `--fault-every` seconds one fault fires in turn: a
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
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from .common import RESULTS_DIR, append_results
from .soak_corpus import PATHOLOGICAL
from .soak_report import FAULTS, Record, plot, verdict
from .soak_traffic import Outcome, Traffic

PROFILES = {"default": 30.0, "ci": 2.0}
SAMPLE_EVERY_S = 10.0


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


def warm_caches(url: str) -> None:
    """Send every pathological constraint of the corpus once, one at a time, before the clock
    starts.

    The compiled-constraint cache holds what the traffic compiles, up to its bound: the
    pathological `maxLength` 600 schema alone is a 222 MiB index, about 360 MiB of RSS. Filled
    whenever the mix first draws it, that would be a step in RSS at a random minute; filled
    here, RSS growth over the run measures leaks, not a bounded cache filling up. Refusals
    (bad patterns, compile limits) are expected and ignored."""
    with httpx.Client(timeout=120) as client:
        for spec in PATHOLOGICAL:  # as soak_traffic.py sends them; the others are small
            body = {"text": "x", "sampling_params": {"max_new_tokens": 16} | spec}
            client.post(f"{url}/generate", json=body)


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
        warm_caches(url)
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
