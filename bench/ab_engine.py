"""The engine at two commits, side by side: the same workloads on this tree (candidate) and on
a baseline commit, each in its own process, interleaved round by round.

    python -m stemma.bench.ab_engine --baseline COMMIT [--rounds 5] [--dtype auto]
    python -m stemma.bench.ab_engine --baseline COMMIT --engine '{"speculative_algorithm":
        "NGRAM"}' --workloads "decode b=8 in=32 out=64" "rewrite b=8 out=64"

The baseline is checked out as a detached git worktree beside the repository (kept for the next
run). Each side's process loads the engine once and runs what the parent asks over a pipe, one
workload at a time, so only one side computes at any moment; each round runs both sides of a
workload back to back, in alternating order. Workloads (greedy, ignore_eos, no cache hits):
decode at batch 1 and 32 (32-token prompts, 64 new tokens) and prefill (8 prompts of 512
tokens, 1 new token) by default; decode at batch 8, and rewrites (a chat request to repeat a
paragraph, each request its own) at batch 1 and 8, on request. `--engine`: engine options
both sides take (a JSON object), such as a draft algorithm. Reported: each side's median
seconds, the median of per-round ratios baseline / candidate (> 1: the candidate is faster)
and the ratio of the fastest rounds.
Results: bench/results/ab_engine.jsonl.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from .common import REWRITE_ASK, append_results, bench_parser, git_commit, print_table

REPO = Path(__file__).resolve().parents[1]

# Runs inside each side's process; only the Engine's public API, so any commit can serve.
WORKER = r"""
import json, random, sys, time
from stemma.runtime.engine import Engine

engine = Engine(sys.argv[1], dtype=sys.argv[2], kv_cache_mb=1024, **json.loads(sys.argv[3]))
REWRITE_ASK = sys.argv[4]  # the parent's: the baseline's tree may not have it
rng = random.Random(0)

def prompts(n, length):
    return [[rng.randrange(100, 40000) for _ in range(length)] for _ in range(n)]

def rewrites(n):
    chats = [[{"role": "user", "content": f"({i}) {REWRITE_ASK}"}] for i in range(n)]
    return [engine.apply_chat_template(c) for c in chats]

def run(ids, new):
    engine.flush_cache()
    params = {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}
    start = time.perf_counter()
    if isinstance(ids[0], str):
        outs = engine.generate(ids, [params] * len(ids))
    else:
        outs = engine.generate(input_ids=ids, sampling_params=params)
    seconds = time.perf_counter() - start
    outs = outs if isinstance(outs, list) else [outs]
    if any(o["meta_info"]["completion_tokens"] != new for o in outs):
        raise RuntimeError("a request did not write all its tokens")
    return seconds

WORKLOADS = {
    "decode b=1 in=32 out=64": (prompts(1, 32), 64),
    "decode b=32 in=32 out=64": (prompts(32, 32), 64),
    "prefill 8 x 512 out=1": (prompts(8, 512), 1),
    "decode b=8 in=32 out=64": (prompts(8, 32), 64),
    "rewrite b=1 out=128": (rewrites(1), 128),
    "rewrite b=8 out=64": (rewrites(8), 64),
}
run(*WORKLOADS["decode b=1 in=32 out=64"])  # warm-up
print(json.dumps({"ready": engine.dtype.name}), flush=True)
for line in sys.stdin:
    name = line.strip()
    print(json.dumps({"seconds": run(*WORKLOADS[name])}), flush=True)
"""
WORKLOAD_NAMES = ["decode b=1 in=32 out=64", "decode b=32 in=32 out=64", "prefill 8 x 512 out=1"]
MORE_WORKLOADS = ["decode b=8 in=32 out=64", "rewrite b=1 out=128", "rewrite b=8 out=64"]


def baseline_tree(commit: str) -> Path:
    """A detached worktree of `commit` beside the repository, made once."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", commit], cwd=REPO, check=True, capture_output=True,
        text=True,
    ).stdout.strip()  # fmt: skip
    tree = REPO.parent / f".stemma-ab-{sha}"
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=REPO, check=True)
    return tree


def package_dir(tree: Path) -> Path:
    """A folder beside `tree` whose `stemma` is `tree` (made once): a process started there
    with it as PYTHONPATH imports that tree's stemma."""
    pkg = tree.parent / f".{tree.name}-pkg"
    pkg.mkdir(exist_ok=True)
    if not (pkg / "stemma").exists():
        (pkg / "stemma").symlink_to(tree)
    return pkg


class Side:
    """One tree's engine in its own process; `stemma` resolves to that tree."""

    def __init__(self, tree: Path, model: str, dtype: str, options: str = "{}"):
        pkg = package_dir(tree)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, model, dtype, options, REWRITE_ASK],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(pkg)},
            cwd=pkg,  # `python -c` looks in its directory first: one holding another stemma
        )
        self.dtype = self._read()["ready"]

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"a side's engine exited (status {self.proc.wait()})")
        return json.loads(line)

    def run(self, workload: str) -> float:
        self.proc.stdin.write(workload + "\n")
        self.proc.stdin.flush()
        return self._read()["seconds"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main(argv: list[str] | None = None) -> None:
    p = bench_parser(__doc__)
    p.add_argument("--baseline", required=True, help="the commit to compare against")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--workloads", nargs="+", choices=WORKLOAD_NAMES + MORE_WORKLOADS, default=WORKLOAD_NAMES
    )
    p.add_argument("--engine", default="{}", help="engine options of both sides, as JSON")
    args = p.parse_args(argv)
    if not isinstance(json.loads(args.engine), dict):
        raise SystemExit(f"--engine must be a JSON object, got {args.engine!r}")
    sides = {
        "baseline": Side(baseline_tree(args.baseline), args.model, args.dtype, args.engine),
        "candidate": Side(REPO, args.model, args.dtype, args.engine),
    }
    times: dict[str, dict[str, list[float]]] = {w: {s: [] for s in sides} for w in args.workloads}
    try:
        for r in range(args.rounds):
            for w in args.workloads:
                order = list(sides) if r % 2 == 0 else list(sides)[::-1]
                for name in order:
                    times[w][name].append(sides[name].run(w))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        for side in sides.values():
            side.close()
    rows = []
    for w, t in times.items():
        ratios = [b / c for b, c in zip(t["baseline"], t["candidate"], strict=True)]
        rows.append(
            {
                "workload": w,
                "metric": "seconds",
                "baseline": statistics.median(t["baseline"]),
                "candidate": statistics.median(t["candidate"]),
                "ratio": statistics.median(ratios),
                # a busy machine only adds time: the fastest rounds are the least disturbed
                "ratio_of_mins": min(t["baseline"]) / min(t["candidate"]),
                "rounds": args.rounds,
                "round_seconds": {k: [round(x, 4) for x in v] for k, v in t.items()},
            }
        )
    print_table(rows, ["workload", "baseline", "candidate", "ratio", "ratio_of_mins"])
    extra = {"baseline_commit": args.baseline, "candidate_commit": git_commit()}
    extra |= {"model": args.model, "dtype": sides["candidate"].dtype}
    extra |= {"engine": json.loads(args.engine)}
    print("appended to", append_results("ab_engine", rows, **extra))


if __name__ == "__main__":
    main()
