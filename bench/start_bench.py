"""The compiled engine's start at two commits: its time, resident memory and cache on disk,
from an empty cache dir and then again on it.

    python -m stemma.bench.start_bench --baseline COMMIT [--starts 3] [--engine '{...}']

Each side gets a cache dir of its own, empty but for the kept row verdicts (the candidate's
first start measures them, and the baseline's starts with a copy, so both compile the same
row limits). Then each start is an `Engine(..., enable_torch_compile=True)` in a fresh
process, the two sides in turn: the first from the empty cache (cold), the others on it.
Reported per start: seconds to a ready engine, `torch_compile_s`, resident memory once ready
(RssAnon and RssFile, MB) and the cache's `aot/` packages on disk (MB).
Results: bench/results/start_bench.jsonl.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .ab_engine import REPO, baseline_tree, package_dir
from .common import append_results, bench_parser, git_commit, print_table

CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
from stemma.runtime.engine import Engine
engine = Engine(sys.argv[1], dtype=sys.argv[2], enable_torch_compile=True, cache_dir=sys.argv[3],
                **json.loads(sys.argv[4]))
seconds = time.perf_counter() - t0
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
mb = lambda key: int(status[key].split()[0]) // 1024
info = engine.get_model_info()
print(json.dumps({"start_s": seconds, "torch_compile_s": info["torch_compile_s"],
                  "rss_anon_mb": mb("RssAnon"), "rss_file_mb": mb("RssFile"),
                  "note": info["torch_compile_note"]}), flush=True)
os._exit(0)  # the start is what is measured: no shutdown
"""


def start(tree: Path | None, model: str, dtype: str, cache: Path, options: str) -> dict[str, Any]:
    """One start in a fresh process whose `stemma` is `tree`'s (None: this checkout's)."""
    env, cwd = dict(os.environ), REPO.parent
    if tree is not None:
        cwd = package_dir(tree)
        env["PYTHONPATH"] = str(cwd)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, model, dtype, str(cache), options],
        cwd=cwd,  # `python -c` looks in its directory first
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"a start failed ({out.returncode}): {out.stderr[-2000:]}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    aot = cache / "aot"
    files = [f for f in aot.rglob("*") if f.is_file()] if aot.exists() else []
    return {**row, "aot_mb": sum(f.stat().st_size for f in files) / 2**20}


def main(argv: list[str] | None = None) -> None:
    p = bench_parser(__doc__)
    p.add_argument("--baseline", required=True, help="the commit to compare against")
    p.add_argument("--starts", type=int, default=3, help="per side: the cold one, then warm")
    p.add_argument("--engine", default="{}", help="more engine options of both sides, as JSON")
    args = p.parse_args(argv)
    if not isinstance(json.loads(args.engine), dict):
        raise SystemExit(f"--engine must be a JSON object, got {args.engine!r}")
    if args.starts < 1:
        raise SystemExit(f"--starts must be at least 1, got {args.starts}")
    sides = {"candidate": None, "baseline": baseline_tree(args.baseline)}
    rows = []
    with tempfile.TemporaryDirectory() as work:
        caches = {name: Path(work) / name for name in sides}
        for n in range(args.starts):
            for name, tree in sides.items():
                if n == 0 and name == "baseline":  # the candidate's verdicts, not its code
                    shutil.copytree(caches["candidate"] / "measured", caches[name] / "measured")
                row = start(tree, args.model, args.dtype, caches[name], args.engine)
                rows.append({"side": name, "start": "cold" if n == 0 else f"warm {n}", **row})
                print(json.dumps(rows[-1]), flush=True)
    commits = {"candidate": git_commit(), "baseline": args.baseline}
    for row in rows:
        row["side_commit"] = commits[row["side"]]
        for key in ("start_s", "torch_compile_s", "aot_mb"):
            row[key] = round(row[key], 1)
    print_table(
        rows,
        ["side", "start", "start_s", "torch_compile_s", "rss_anon_mb", "rss_file_mb", "aot_mb"],
    )
    print("appended to", append_results("start_bench", rows, engine=json.loads(args.engine)))


if __name__ == "__main__":
    main()
