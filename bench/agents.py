"""The agent suite (examples/) on stemma, its ablations, HF transformers and llama.cpp's server.

  python -m stemma.bench.agents [--programs all] [--num 16] [--concurrency 8] [--rounds 1]
      [--systems stemma,no-radix,fcfs,no-jump-forward,hf-naive,llama.cpp] [--max-tokens N]

Every program runs `--num` times (distinct inputs from its `workload`) with `--concurrency`
programs in flight, on each system in turn; a round runs every system once, in alternating
order, so load drifts hit all alike. stemma systems are in-process Runtimes (default; radix
cache off; FCFS instead of longest-prefix-match; jump-forward off; and, when named, `ngram`:
speculative decoding by prompt lookup, `dequantized`: --quantization none); `hf-naive` runs each gen
as one plain transformers `generate` (on `--hf-num` programs); `llama.cpp` is its server (the
xllamacpp wheel, skipped with a message when absent) on the same GGUF through stemma.OpenAI.
Every measured run starts with empty prompt caches: stemma's radix tree is flushed and
llama.cpp's server is restarted (its slots and its host-memory prompt cache would otherwise
still hold the prompts of the warm-up and of earlier rounds, which are the same programs).
Rows in bench/results/agents.jsonl; one PNG per program and a ratio table (agents_table.md).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

from tqdm import tqdm

from ..runtime.dtype_policy import cpu_isa
from .agent_report import plot_program, ratio_table
from .agent_trace import Recorder, median_or_none, optimum_hit_rate, summarize
from .anchors import LlamaServer
from .common import RESULTS_DIR, append_results, print_table

PROGRAMS = [
    "multiple_choice",
    "tree_of_thought",
    "skeleton_of_thought",
    "llm_judge",
    "react_agent",
    "tool_call_agent",
    "multi_turn_chat",
]
STEMMA_CONFIGS = {
    "stemma": {},
    "no-radix": {"disable_radix_cache": True},
    "fcfs": {"schedule_policy": "fcfs"},
    "no-jump-forward": {"enable_jump_forward": False},
    "ngram": {"speculative_algorithm": "NGRAM"},  # prompt-lookup drafts (opt-in)
    "dequantized": {"quantization": "none"},  # a GGUF's own 4-bit blocks unused
}
OPT_IN = ("ngram", "dequantized")  # run only when named in --systems
SYSTEMS = [*(n for n in STEMMA_CONFIGS if n not in OPT_IN), "hf-naive", "llama.cpp"]
LLAMA_PORT = 18191


def open_systems(
    names: list[str], args: argparse.Namespace, stack: ExitStack
) -> tuple[dict[str, Any], dict[str, Callable[[], None]]]:
    """name -> Backend, each shut down when `stack` closes; name -> how to empty its caches."""
    import stemma

    backends: dict[str, Any] = {}
    resets: dict[str, Callable[[], None]] = {}
    for name in names:
        if name in STEMMA_CONFIGS:
            rt = stemma.Runtime(model=args.model, dtype=args.dtype, **STEMMA_CONFIGS[name])
            stack.callback(rt.shutdown)
            backends[name] = rt
            resets[name] = rt.flush_cache
    template = next(iter(backends.values())).get_chat_template() if backends else None
    if "hf-naive" in names:
        from .hf_naive import HFNaive

        dtype = "float32" if args.dtype == "auto" else args.dtype
        backends["hf-naive"] = HFNaive(args.model, dtype, template)
    if "llama.cpp" in names:
        if importlib.util.find_spec("xllamacpp") is None:
            print("skipping llama.cpp: its server is not installed (pip install xllamacpp)")
        else:
            server = LlamaServer(LLAMA_PORT)
            stack.callback(server.stop)
            server.start()
            backends["llama.cpp"] = stemma.OpenAI("smollm2-135m", base_url=server.url + "/v1")
            resets["llama.cpp"] = server.restart
    return backends, resets


def run_programs(
    module: Any, backend: Any, items: list[dict[str, Any]], concurrency: int, bar: tqdm
) -> tuple[float, Recorder, list[str]]:
    """Seconds to run every item with `concurrency` in flight; the records; error messages."""
    recorder = Recorder(backend)
    errors: list[str] = []

    def one(item: dict[str, Any]) -> None:
        try:
            module.PROGRAM.run(**item, backend=recorder).sync()
        except Exception as err:  # a failed program is counted and reported, not fatal
            errors.append(f"{type(err).__name__}: {err}"[:200])
        bar.update(1)

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, items))
    return time.perf_counter() - start, recorder, errors


def program_items(module: Any, num: int, max_tokens: int | None) -> list[dict[str, Any]]:
    items = module.workload(num)
    takes_max = "max_tokens" in inspect.signature(module.PROGRAM.func).parameters
    return (
        [{**item, "max_tokens": max_tokens} for item in items]
        if max_tokens and takes_max
        else items
    )


def bench_program(
    name: str,
    backends: dict[str, Any],
    resets: dict[str, Callable[[], None]],
    args: argparse.Namespace,
) -> list[dict]:
    module = importlib.import_module(f"stemma.examples.{name}")
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in backends}
    optimum: list[float | None] = []
    order = list(backends)
    total = sum(args.hf_num if s == "hf-naive" else args.num for s in order) * args.rounds
    with tqdm(total=total, desc=name, unit="prog") as bar:
        for r in range(args.rounds):
            for system in order if r % 2 == 0 else reversed(order):
                backend = backends[system]
                reset = resets.get(system, lambda: None)  # hf-naive caches nothing
                num = args.hf_num if system == "hf-naive" else args.num
                if r == 0:  # warm-up on an input outside the measured ones
                    warm = program_items(module, args.num + 1, args.max_tokens)[-1:]
                    run_programs(module, backend, warm, 1, tqdm(disable=True))
                reset()
                items = program_items(module, num, args.max_tokens)
                seconds, recorder, errors = run_programs(
                    module, backend, items, args.concurrency, bar
                )
                run = summarize(recorder.records, seconds, len(items)) | {
                    "seconds": round(seconds, 3)
                }
                if errors:  # a rate over failed programs means nothing
                    run |= {"programs_per_s": None, "output_tok_s": None}
                runs[system].append(run | {"errors": errors[:3], "num_errors": len(errors)})
                if system == "stemma":
                    optimum.append(optimum_hit_rate(recorder.records, backend.tokenize))
    rows = []
    for system, system_runs in runs.items():
        row: dict[str, Any] = {"program": name, "system": system, "cpu_isa": cpu_isa()}
        row |= {"threads": os.cpu_count(), "dtype": args.resolved_dtype}
        row["num"] = args.hf_num if system == "hf-naive" else args.num
        row |= {"concurrency": args.concurrency, "max_tokens": args.max_tokens}
        for key in system_runs[0]:
            if key not in ("errors", "num_errors"):
                row[key] = median_or_none([run[key] for run in system_runs])
        row |= {"optimum_hit_rate": median_or_none(optimum), "rounds": system_runs}
        row["num_errors"] = sum(run["num_errors"] for run in system_runs)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m stemma.bench.agents")
    p.add_argument("--programs", default="all", help=f"comma-separated, from {PROGRAMS}")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--num", type=int, default=16, help="programs per run")
    p.add_argument("--hf-num", type=int, default=4, help="programs per hf-naive run")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=None, help="override free-text gen lengths")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="auto")
    args = p.parse_args(argv)
    programs = PROGRAMS if args.programs == "all" else args.programs.split(",")
    columns = ["program", "system", "programs_per_s", "output_tok_s", "cache_hit_rate"]
    columns += ["optimum_hit_rate", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s"]
    columns += ["num_errors"]
    all_rows: list[dict[str, Any]] = []
    with ExitStack() as stack:
        backends, resets = open_systems(args.systems.split(","), args, stack)
        stemma_rt = next((b for n, b in backends.items() if n in STEMMA_CONFIGS), None)
        args.resolved_dtype = stemma_rt.get_model_info()["dtype"] if stemma_rt else args.dtype
        for name in programs:
            rows = bench_program(name, backends, resets, args)
            print_table(rows, columns)
            plot_program(name, rows, RESULTS_DIR / f"agents_{name}.png")
            append_results("agents", rows)  # per program, so an interrupted run keeps them
            all_rows += rows
    table = ratio_table(all_rows)
    (RESULTS_DIR / "agents_table.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
