"""oneDNN's per-shape caches: server memory and speed at each capacity, side by side.

torch's bfloat16 matmuls on CPU go through oneDNN, which keeps a compiled primitive (and ideep
its computation) for every input shape it has seen, up to 1024 of each by default. A server
sees a new row count at almost every step, so that memory grows for as long as new shapes
come (about +450 MiB over 160 prompt lengths on SmolLM2), and a long soak's RSS never levels.
The engine caps both caches (runtime/cpu_caches.py); this bench picks the cap.

    python -m stemma.bench.shape_cache [--caps 1024,64] [--rounds 3] [--shapes 160]

Each round starts one process per capacity, in alternating order, each of which measures:
  rss_growth_mb  RSS after `--shapes` requests of distinct prompt lengths (one new token
                 each), minus RSS after warm-up;
  decode_b1/b16  tokens/s decoding 64 tokens at batch 1 and 16 (shapes that repeat);
  mixed_s        seconds for 24 requests of distinct lengths submitted together, 16 new tokens
                 each (continuous batching: a new row count at nearly every step).
Speed ratios are paired per round against the first capacity listed. Results go to
bench/results/shape_cache.jsonl; run it where bfloat16 is native (otherwise the engine runs
float32 and no oneDNN cache is involved), and the stamp says which CPU that was.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from .common import append_results, hardware, print_table

CHILD_FLAG = "--child"


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def words(n: int, seed: int) -> str:
    return " ".join(f"w{(seed * 31 + j) % 97}" for j in range(n))


def child(shapes: int) -> dict[str, Any]:
    from stemma.runtime.engine import Engine

    engine = Engine("smollm2-135m", dtype="auto")
    greedy = {"temperature": 0, "ignore_eos": True}

    def decode(batch: int) -> float:
        prompts = [words(20, i) for i in range(batch)]
        t = time.perf_counter()
        engine.generate(prompts, {**greedy, "max_new_tokens": 64})
        return batch * 64 / (time.perf_counter() - t)

    decode(1)  # warm-up
    decode(16)
    base = rss_mb()
    for i in range(shapes):
        engine.generate(words(7 + 3 * i, i), {**greedy, "max_new_tokens": 1})
    growth = rss_mb() - base
    t = time.perf_counter()
    engine.generate([words(5 + 7 * i, i) for i in range(24)], {**greedy, "max_new_tokens": 16})
    mixed = time.perf_counter() - t
    out = {
        "dtype": engine.get_model_info()["dtype"],
        "rss_growth_mb": round(growth, 1),
        "decode_b1": round(decode(1), 2),
        "decode_b16": round(decode(16), 2),
        "mixed_s": round(mixed, 3),
    }
    engine.shutdown()
    return out


def run_child(cap: int, shapes: int) -> dict[str, Any]:
    env = {**os.environ, "STEMMA_ONEDNN_CACHE_CAPACITY": str(cap)}
    proc = subprocess.run(
        [sys.executable, "-m", "stemma.bench.shape_cache", CHILD_FLAG, str(shapes)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == CHILD_FLAG:
        print(json.dumps(child(int(sys.argv[2]))))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--caps", default="1024,64", help="capacities; the first is the baseline")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", type=int, default=160)
    args = ap.parse_args()
    caps = [int(c) for c in args.caps.split(",")]
    runs: dict[int, list[dict[str, Any]]] = {c: [] for c in caps}
    for r in range(args.rounds):
        for cap in caps if r % 2 == 0 else list(reversed(caps)):
            runs[cap].append(run_child(cap, args.shapes))
            print(f"round {r + 1} cap {cap}: {runs[cap][-1]}", flush=True)
    base = runs[caps[0]]
    rows = []
    for cap in caps:
        got = runs[cap]
        row: dict[str, Any] = {"workload": "shape_cache", "capacity": cap, "shapes": args.shapes}
        row["dtype"] = got[0]["dtype"]
        for key in ("rss_growth_mb", "decode_b1", "decode_b16", "mixed_s"):
            row[key] = statistics.median(g[key] for g in got)
        # paired per round against the baseline: > 1 means this capacity is faster
        row["decode_b1_ratio"] = round(
            statistics.median(g["decode_b1"] / b["decode_b1"] for g, b in zip(got, base)), 3
        )
        row["decode_b16_ratio"] = round(
            statistics.median(g["decode_b16"] / b["decode_b16"] for g, b in zip(got, base)), 3
        )
        row["mixed_ratio"] = round(
            statistics.median(b["mixed_s"] / g["mixed_s"] for g, b in zip(got, base)), 3
        )
        row["rounds"] = got
        rows.append(row)
    print(f"hardware: {hardware()}")
    print_table(
        rows,
        [
            "capacity",
            "dtype",
            "rss_growth_mb",
            "decode_b1",
            "decode_b1_ratio",
            "decode_b16",
            "decode_b16_ratio",
            "mixed_s",
            "mixed_ratio",
        ],
    )
    append_results("shape_cache", rows)


if __name__ == "__main__":
    main()
