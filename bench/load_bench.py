"""Model load time (cold: GGUF conversion into an empty cache; warm: cached) and peak memory.

  python -m stemma.bench.load_bench [--model smollm2-135m] [--repeats 3]

Each load runs in a fresh process (imports included), as a user's first and later starts do.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile

from .common import append_results, print_table

CHILD = """
import json, resource, sys, time
t0 = time.perf_counter()
import torch
from pathlib import Path
from stemma.runtime.models.loader import load_model
t1 = time.perf_counter()
load_model(sys.argv[1], getattr(torch, sys.argv[2]), cache_dir=Path(sys.argv[3]))
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "total_s": t2 - t0,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def load_once(model: str, dtype: str, cache_dir: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, model, dtype, cache_dir],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    rows = []
    cold, warm = [], []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as cache:
            cold.append(load_once(args.model, args.dtype, cache))
            warm.append(load_once(args.model, args.dtype, cache))
    for name, runs in (("cold (convert GGUF)", cold), ("warm (cached)", warm)):
        for metric in ("load_s", "total_s", "peak_rss_mb"):
            rows.append(
                {
                    "workload": f"load {args.model} {args.dtype} {name}",
                    "metric": metric,
                    "value": statistics.median(r[metric] for r in runs),
                }
            )
    print_table(rows, ["workload", "metric", "value"])
    print("appended to", append_results("load_bench", rows))


if __name__ == "__main__":
    main()
