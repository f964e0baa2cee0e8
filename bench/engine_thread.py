"""What an idle OpenMP team on another thread costs the engine's decode.

    python -m stemma.bench.engine_thread [--rounds 3] [--compiled] [--new 128]

torch's CPU ops open parallel regions through OpenMP, and libgomp keeps a team of worker
threads for every thread that ever opened one. The engine loads its model on its own thread
(runtime/engine.py), so its thread is the only one with a team. This bench measures what that
is worth: each round starts two fresh processes, in alternating order, that build the same
Engine and time single-stream greedy decode (3 prompts, EOS ignored; tokens/s, median of 3
passes):
  engine:      the Engine as built;
  caller-team: the same, after the caller's thread has run one parallel op, which leaves its
               team idle beside the engine's (the state a load on the caller's thread left).
A ratio is caller-team's seconds over engine's within a round (above 1 = the team costs);
the row gives its median over rounds. Results: bench/results/engine_thread.jsonl.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

from .common import append_results, bench_parser, print_table

PROMPTS = [
    "Tell me a story about a dragon who",
    "Explain how a compiler works in",
    "Write a poem about the sea and",
]

CHILD = """
import json, statistics, sys, time
import torch
from stemma.runtime.engine import Engine

variant, model, options, new = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
prompts = json.loads(sys.argv[5])
with Engine(model, **options) as engine:
    if variant == "caller-team":
        torch.ones(1 << 22).sum()  # one parallel region on this thread: its team stays
    params = {"temperature": 0, "max_new_tokens": new, "ignore_eos": True}
    engine.generate(prompts[0], {**params, "max_new_tokens": 8})
    rates = []
    for _ in range(3):
        for prompt in prompts:
            t = time.perf_counter()
            out = engine.generate(prompt, params)
            rates.append(out["meta_info"]["completion_tokens"] / (time.perf_counter() - t))
print(json.dumps({"tok_s": statistics.median(rates)}))
"""

VARIANTS = ("engine", "caller-team")


def run_child(variant: str, model: str, options: dict, new: int) -> float:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            variant,
            model,
            json.dumps(options),
            str(new),
            json.dumps(PROMPTS),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["tok_s"]


def main(argv: list[str] | None = None) -> None:
    p = bench_parser(__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--compiled", action="store_true", help="--enable-torch-compile")
    args = p.parse_args(argv)
    options = {"dtype": args.dtype, "enable_torch_compile": args.compiled}
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for variant in VARIANTS if r % 2 == 0 else reversed(VARIANTS):
            rates[variant].append(run_child(variant, args.model, options, args.new))
            print(f"round {r + 1}: {variant} {rates[variant][-1]:.1f} tok/s", flush=True)
    ratios = [e / c for e, c in zip(rates["engine"], rates["caller-team"], strict=True)]
    row = {
        "model": args.model,
        "dtype": args.dtype,
        "compiled": args.compiled,
        "new_tokens": args.new,
        "rounds": args.rounds,
        "engine_tok_s": round(statistics.median(rates["engine"]), 1),
        "caller_team_tok_s": round(statistics.median(rates["caller-team"]), 1),
        "team_cost": round(statistics.median(ratios), 2),
        "engine_runs": [round(x, 1) for x in rates["engine"]],
        "caller_team_runs": [round(x, 1) for x in rates["caller-team"]],
    }
    print_table([row], ["compiled", "engine_tok_s", "caller_team_tok_s", "team_cost"])
    append_results("engine_thread", [row])


if __name__ == "__main__":
    main()
