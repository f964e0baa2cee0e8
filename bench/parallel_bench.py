"""Tensor and data parallelism on this machine.

tp: the same decode workload (8 requests, ~40-token prompts, 32 new tokens, greedy) at tp_size
1 and 3 (SmolLM2-135M has 9 query and 3 KV heads, so 2 does not divide it); seconds per engine
step, all-reduces and gathers per step, and memory per rank (weights and KV pool bytes of rank
0's shard, RSS of every rank's process).
dp: 4 shared prefixes x 8 requests through `stemma serve --dp-size 2` (sglang-router,
cache_aware) and through one `stemma serve`; every response checked, cache-hit share and
throughput of each.

    python -m stemma.bench.parallel_bench --part tp
    python -m stemma.bench.parallel_bench --part dp
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .common import append_results, print_table

PROMPT = "Write one sentence about the number {i}. " * 4


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bench_tp(model: str, dtype: str, steps_rounds: int, sizes: list[int]) -> list[dict[str, Any]]:
    from stemma.runtime.engine import Engine

    rows = []
    for tp in sizes:
        with Engine(model, dtype=dtype, tp_size=tp, max_total_tokens=4096) as engine:
            prompts = [PROMPT.format(i=i) for i in range(8)]
            sp = {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}
            engine.generate(prompts[:1], {**sp, "max_new_tokens": 4})  # warm-up
            group = engine.runner.model.tp
            times = []
            for _ in range(steps_rounds):
                engine.flush_cache()
                m0, ar0, g0 = (
                    engine.get_metrics()["num_steps"],
                    group.num_all_reduce,
                    group.num_gather,
                )
                t0 = time.perf_counter()
                outs = engine.generate(prompts, sp)
                times.append(time.perf_counter() - t0)
            steps = engine.get_metrics()["num_steps"] - m0
            model_ = engine.runner.model
            weights = sum(p.numel() * p.element_size() for p in model_.parameters())
            pool = engine.runner.kv_pool
            kv = sum(t.numel() * t.element_size() for t in pool.k + pool.v)
            pids = [os.getpid(), *(engine.tp.pids.values() if engine.tp else [])]
            rows.append({
                "bench": "tp", "model": model, "dtype": dtype, "tp_size": tp,
                "workload": "8 req x 32 in / 32 out, greedy", "rounds": steps_rounds,
                "seconds": min(times), "steps": steps,
                "ms_per_step": 1000 * min(times) / steps,
                "all_reduce_per_step": (group.num_all_reduce - ar0) / steps,
                "gather_per_step": (group.num_gather - g0) / steps,
                "weights_mb_rank0": weights / 2**20, "kv_pool_mb_rank0": kv / 2**20,
                "kv_slots": pool.num_slots, "rss_mb_per_rank": [round(rss_mb(p)) for p in pids],
                "output_ids": [o["output_ids"] for o in outs],
            })  # fmt: skip
    first = rows[0].pop("output_ids")
    for row in rows[1:]:
        row["same_ids_as_tp1"] = row.pop("output_ids") == first
    return rows


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url + "/generate", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def shared_prefix_traffic(url: str) -> dict[str, Any]:
    prefixes = [f"System {k}: " + f"You answer questions about topic {k} briefly. " * 12
                for k in range(4)]  # fmt: skip
    bodies = [{"text": p + f"Question {j}: what is {j} plus {k}?", "sampling_params":
               {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}
              for k, p in enumerate(prefixes) for j in range(8)]  # fmt: skip
    post(url, bodies[0] | {"text": "warm up"})
    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda b: post(url, b), bodies))
    seconds = time.perf_counter() - t0
    valid = all(o["meta_info"]["completion_tokens"] == 8 and o["meta_info"]["finish_reason"]
                ["type"] == "length" for o in outs)  # fmt: skip
    cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
    prompt = sum(o["meta_info"]["prompt_tokens"] for o in outs)
    return {"requests": len(outs), "all_valid": valid, "seconds": seconds,
            "req_per_s": len(outs) / seconds, "cache_hit_share": cached / prompt}  # fmt: skip


def bench_dp(model: str, port: int) -> list[dict[str, Any]]:
    from stemma.runtime.server.data_parallel import wait_healthy

    rows = []
    for dp in (1, 2):
        cmd = [sys.executable, "-m", "stemma", "serve", "--model", model, "--port", str(port),
               "--log-level", "warning", "--dp-size", str(dp)]  # fmt: skip
        if dp == 1:
            cmd += ["--num-threads", str(os.cpu_count() or 1)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_healthy(f"http://127.0.0.1:{port}", proc)
            time.sleep(2 if dp > 1 else 0)  # the router's worker registration
            row = shared_prefix_traffic(f"http://127.0.0.1:{port}")
        finally:
            proc.terminate()
            proc.wait(120)
        rows.append(
            {
                "bench": "dp",
                "model": model,
                "dp_size": dp,
                "front": "sglang-router 0.3.2 cache_aware" if dp > 1 else "one server",
                "workload": "4 prefixes x 8 requests, 8 concurrent, 8 new tokens",
                **row,
            }
        )
    rows[1]["throughput_vs_one"] = rows[1]["req_per_s"] / rows[0]["req_per_s"]
    rows[1]["hit_share_vs_one"] = rows[1]["cache_hit_share"] - rows[0]["cache_hit_share"]
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=["tp", "dp"], required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port", type=int, default=31500)
    ap.add_argument("--tp-sizes", default="1,3", help="SmolLM2-135M: 9 heads, 3 KV heads")
    args = ap.parse_args(argv)
    rows = (
        bench_tp(args.model, args.dtype, args.rounds, [int(x) for x in args.tp_sizes.split(",")])
        if args.part == "tp"
        else bench_dp(args.model, args.port)
    )
    append_results("parallel_bench", rows)
    print_table(rows, [k for k in rows[-1] if not isinstance(rows[-1][k], list)])


if __name__ == "__main__":
    main()
