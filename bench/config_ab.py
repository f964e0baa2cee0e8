"""One engine option against the engine without it, interleaved, each engine in a process of
its own (bench/common.EngineProcess). Rows without "engine_processes" held both engines in
one process, each run paying for the other's OpenMP team (runtime/engine.py).

    python -m stemma.bench.config_ab --candidate '{"enable_torch_compile": true}'
    python -m stemma.bench.config_ab --candidate '{"speculative_algorithm": "NGRAM"}' \\
        --batches 8,32,64 --rounds 5
    python -m stemma.bench.config_ab --batches 1 --new 128 \\
        --baseline '{"enable_torch_compile": true, "torch_compile_aot": false}' \\
        --candidate '{"torch_compile_aot": true}'
    (all take --dtype, --quantization, --batches 1,8,32, --new 64, --rounds 5, --prompt;
    --baseline: options both engines share, the candidate's on top)

Per batch size: decode tokens/s of each engine (greedy, EOS ignored; distinct random
32-token prompts, or with --prompt text a chat request asking to repeat a paragraph, the
rewrite case), the median over rounds of the baseline's seconds over the candidate's (above
1 = the candidate faster) and the share of requests with the same tokens. A candidate that
compiles also reports its start-up: the compile on an empty Inductor cache, the same start
again in a fresh process (a cache hit), and the cache's size.
Results: a table and JSON lines in bench/results/config_ab.jsonl.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..runtime.executor.compiled import directory_mb
from ..runtime.models.loader import default_cache_dir
from .common import (
    EngineProcess,
    add_decode_rounds,
    append_results,
    bench_parser,
    interleaved_times,
    paired_speedup,
    print_table,
    round_prompts,
    rss_mb,
)

START = """
import json, sys
from stemma.runtime.engine import Engine
with Engine(sys.argv[1], **json.loads(sys.argv[2])) as e:
    print(e.get_model_info()["torch_compile_s"])
"""


def start_up(model: str, candidate: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """The compiled candidate's start: cold (this process, empty cache), warm (a new one)."""
    engine_cfg = {**config, **candidate}
    warm = subprocess.run(
        [sys.executable, "-c", START, model, json.dumps(engine_cfg)],
        capture_output=True,
        text=True,
        check=True,
    )
    return {"compile_warm_s": float(warm.stdout.strip().splitlines()[-1])}


def share_verdicts(baseline_info: dict[str, Any], cache: Path) -> Path | None:
    """Copy the baseline's kept speed verdicts (runtime/measured.py) into the candidate's
    fresh cache, so that both engines hold their weights alike and the A/B measures the
    option alone: a verdict measured again at the candidate's start can fall the other way
    near a tie, or beside the baseline's process (the int4 blocks' row limit measured 8 rows
    at the baseline's start and 4 at the candidate's, which then ran batch 8 at 0.64x). The
    copy's path, or None where the baseline keeps none."""
    kept = (baseline_info.get("weight_measurements") or {}).get("path")
    if kept is None or not Path(kept).is_file():
        return None
    target = cache / "measured" / Path(kept).name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(kept, target)
    return target


def main(argv: list[str] | None = None) -> None:
    p = bench_parser(__doc__)
    p.add_argument("--candidate", required=True, help="engine options as a JSON object")
    p.add_argument("--baseline", default="{}", help="options of both engines, as JSON")
    p.add_argument("--quantization", default=None)
    add_decode_rounds(p, batches="1,8,32")
    args = p.parse_args(argv)
    candidate = json.loads(args.candidate)
    # An empty engine cache whose converted models are the default one's: a cold compile.
    cache = Path(tempfile.mkdtemp(prefix="stemma-cache-"))
    models = default_cache_dir() / "models"
    models.mkdir(parents=True, exist_ok=True)
    (cache / "models").symlink_to(models, target_is_directory=True)
    config = {"dtype": args.dtype, "quantization": args.quantization, "kv_cache_mb": 512}
    config |= json.loads(args.baseline)
    if (config | candidate).get("enable_torch_compile"):
        candidate = {"cache_dir": str(cache), **candidate}
    baseline = EngineProcess(args.model, **config)  # a process each (EngineProcess says why)
    if candidate.get("cache_dir") == str(cache):
        share_verdicts(baseline.call("get_model_info"), cache)
    engines = {
        "baseline": baseline,
        "candidate": EngineProcess(args.model, **(config | candidate)),  # its options win
    }
    info = engines["candidate"].call("get_model_info")
    startup: dict[str, Any] = {}
    if info["torch_compile_s"] is not None:
        startup = {"compile_cold_s": info["torch_compile_s"]}
        startup["compile_note"] = info["torch_compile_note"]  # the rows left to eager
        startup |= start_up(args.model, candidate, config)
        startup["cache_mb"] = round(directory_mb(cache / "inductor"), 1)
        if info.get("torch_compile_package"):  # the one-row package, beside the cache
            startup["package_mb"] = round(directory_mb(cache / "aot"), 1)
    # resident memory of each engine's process once started (its weights and graphs)
    startup["rss_mb"] = {n: round(rss_mb(e.pid), 1) for n, e in engines.items()}
    rows: list[dict[str, Any]] = []
    rng = random.Random(0)
    base = engines["baseline"]
    vocab = base.attr("vocab_size")

    def template(chat: list[dict[str, str]]) -> str:
        return base.call("apply_chat_template", chat)

    for batch in [int(b) for b in args.batches.split(",")]:
        # Every round its own prompts (the same for both engines), so that no round meets
        # the answers of an earlier one in the radix cache.
        rounds = [
            round_prompts(args.prompt, batch, r, vocab, template, rng) for r in range(args.rounds)
        ]
        params = {"max_new_tokens": args.new, "temperature": 0, "ignore_eos": True}
        outs: dict[str, list] = {}
        calls = dict.fromkeys(engines, 0)

        def run(name, rounds=rounds, params=params, outs=outs, batch=batch, calls=calls) -> None:
            prompts = rounds[calls[name]]
            calls[name] += 1
            res = engines[name].call("generate", sampling_params=[params] * batch, **prompts)
            outs[name] = [o["output_ids"] for o in res]

        times = interleaved_times({n: (lambda n=n: run(n)) for n in engines}, args.rounds)
        tok = {n: round(batch * args.new / sorted(t)[len(t) // 2], 1) for n, t in times.items()}
        same = sum(a == b for a, b in zip(outs["baseline"], outs["candidate"])) / batch
        rows.append(
            {
                "candidate": candidate,
                "baseline": json.loads(args.baseline),
                "model": args.model,
                "dtype": args.dtype,
                "quantization": args.quantization,
                "linear_form": base.attr("runner.plan.linear_form"),
                "prompt": args.prompt,
                "batch": batch,
                "new_tokens": args.new,
                "baseline_tok_s": tok["baseline"],
                "candidate_tok_s": tok["candidate"],
                "speedup": round(paired_speedup(times["baseline"], times["candidate"]), 3),
                "same_outputs": same,
                "engine_processes": True,
                **startup,
                "seconds": times,
            }
        )
        print_table(rows[-1:], [k for k in rows[-1] if k not in ("seconds", "candidate")])
    for e in engines.values():
        e.shutdown()
    print("appended to", append_results("config_ab", rows))


if __name__ == "__main__":
    main()
