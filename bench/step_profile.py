"""Where one request's decode step spends its time, on this CPU: the engine core's phases
(schedule, prepare, forward, outputs, finish) timed per step, detokenizing timed per token,
and the forward's operators grouped by class under torch.profiler.

    python -m stemma.bench.step_profile [--dtype auto] [--quantization int4] [--batch 1]
        [--enable-torch-compile]

The engine core runs in this thread (runtime/engine_core.py, as the engine's loop runs it),
so the phases are exact; the HTTP server and the engine's thread hand-off are not included.
With --enable-torch-compile the decode step is the compiled graph (executor/compiled.py),
its fused kernels profiled one by one (Inductor's kernel profiling, on for this bench).
Results: a table on stdout and JSON lines in bench/results/step_profile.jsonl.
"""

from __future__ import annotations

import random
import statistics
import time
from collections import defaultdict
from typing import Any

import torch

from ..runtime.config import EngineConfig
from ..runtime.dtype_policy import resolve_dtype
from ..runtime.engine_core import EngineCore, build_core, load_runner
from ..runtime.models.loader import resolve_checkpoint
from ..runtime.sampling.params import SamplingParams
from ..runtime.sampling.sampler import SamplingState
from ..runtime.scheduler.planner import prepare_step
from ..runtime.scheduler.req import Req
from ..runtime.tokenizer import IncrementalDetokenizer
from .common import append_results, bench_parser, print_table

PHASES = ("schedule", "prepare", "forward", "outputs", "finish", "detokenize")
# Operator classes of the forward, by substring of the aten op name (first match wins).
OP_CLASSES = [
    ("linear (matmul)", ("linear", "addmm", "mm", "matmul", "bmm", "_weight_int")),
    ("attention", ("attention", "sdpa", "softmax")),
    ("norm", ("rms_norm", "norm", "rsqrt", "pow", "mean")),
    ("rope", ("rope", "cos", "sin")),
    ("copy / index / view", ("copy", "index", "cat", "gather", "scatter", "view", "reshape",
                             "select", "slice", "expand", "contiguous", "empty", "zeros", "fill",
                             "transpose", "unsqueeze", "as_strided", "clone", "stack")),
    ("elementwise", ("add", "mul", "silu", "gelu", "sub", "div", "neg", "where", "masked")),
]  # fmt: skip
COMPILED_CLASS = "compiled fused kernels"  # Inductor's generated kernels (cpp_fused_*)


def op_class(name: str) -> str:
    short = name.split("::")[-1].lower()
    if short.startswith(("cpp_fused", "graph_")):
        return COMPILED_CLASS
    if short == "to":
        return "copy / index / view"
    for label, keys in OP_CLASSES:
        if any(k in short for k in keys):
            return label
    return "other"


def add_requests(core: EngineCore, tokenizer, batch: int, new_tokens: int, vocab: int) -> list:
    rng = random.Random(0)
    reqs = []
    for i in range(batch):
        ids = [rng.randrange(100, min(vocab, 40000)) for _ in range(32)]
        p = SamplingParams.from_dict(
            {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
        )
        req = Req(f"r{i}", ids, p, SamplingState.create(p, ids, vocab))
        core.scheduler.add(req)
        reqs.append(req)
    return reqs


def timed_step(core: EngineCore, detoks: dict[str, IncrementalDetokenizer], t: dict) -> bool:
    """One step with each phase timed (as EngineCore.step runs it); False when it was a
    prefill (only decode steps are counted)."""
    t0 = time.perf_counter()
    batch = core.scheduler.schedule()
    t1 = time.perf_counter()
    fb, plans = prepare_step(core.runner, batch)
    t2 = time.perf_counter()
    logits = core.runner.forward(fb)
    t3 = time.perf_counter()
    core.outputs.process(batch, plans, logits)
    t4 = time.perf_counter()
    core.scheduler.finish_step(batch)
    t5 = time.perf_counter()
    for req in batch.reqs:
        detoks[req.rid].push(req.output_ids[len(detoks[req.rid].ids) :])
    t6 = time.perf_counter()
    is_decode = not any(batch.is_prefill)
    if is_decode:
        for name, a, b in zip(PHASES, (t0, t1, t2, t3, t4, t5), (t1, t2, t3, t4, t5, t6)):
            t[name].append(b - a)
    return is_decode


def main(argv: list[str] | None = None) -> None:
    p = bench_parser(__doc__)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--quantization", default=None, help="int8 | int4 | w8a8_int8")
    p.add_argument("--profile-steps", type=int, default=32, help="steps under torch.profiler")
    p.add_argument("--enable-torch-compile", action="store_true", help="the compiled step")
    args = p.parse_args(argv)
    cfg = EngineConfig(
        model=args.model,
        dtype=args.dtype,
        kv_cache_mb=256,
        quantization=args.quantization,
        enable_torch_compile=args.enable_torch_compile,
    )
    if args.enable_torch_compile:  # each generated kernel a profiler event of its own
        torch._inductor.config.cpp.enable_kernel_profile = True
    dtype = resolve_dtype(cfg.dtype, cfg.device)
    loaded, runner, plan = load_runner(cfg, str(resolve_checkpoint(cfg.model)), dtype)
    vocab = loaded.config.vocab_size
    core = build_core(cfg, runner, loaded.tokenizer, vocab)

    def run(profile: bool) -> dict[str, list[float]]:
        times: dict[str, list[float]] = defaultdict(list)
        reqs = add_requests(core, loaded.tokenizer, args.batch, args.new_tokens, vocab)
        detoks = {r.rid: IncrementalDetokenizer(loaded.tokenizer) for r in reqs}
        while core.scheduler.has_work:
            timed_step(core, detoks, times)
        core.scheduler.flush_cache()
        return times

    run(False)  # warm-up: oneDNN primitives, the allocator
    times = run(False)
    steps = len(times["forward"])
    step_ms = sum(statistics.median(times[n]) for n in PHASES) * 1e3
    rows: list[dict[str, Any]] = []
    for name in PHASES:
        ms = statistics.median(times[name]) * 1e3
        rows.append({"part": name, "median_ms": ms, "share": ms / step_ms})

    # The forward's operators, grouped: self CPU time per class over profile_steps steps.
    add_requests(core, loaded.tokenizer, args.batch, args.profile_steps + 1, vocab)
    core.step()  # the prefill, outside the profile
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        while core.scheduler.has_work:
            core.step()
    core.scheduler.flush_cache()
    by_class: dict[str, float] = defaultdict(float)
    num_ops: dict[str, int] = defaultdict(int)
    for e in prof.key_averages():
        by_class[op_class(e.key)] += e.self_cpu_time_total / 1e3  # ms
        num_ops[op_class(e.key)] += e.count
    total = sum(by_class.values())
    for label, ms in sorted(by_class.items(), key=lambda kv: -kv[1]):
        rows.append(
            {
                "part": f"op class: {label}",
                "median_ms": ms / args.profile_steps,
                "share": ms / total,
                "ops_per_step": num_ops[label] / args.profile_steps,
            }
        )
    forms = f"linears {plan.linear_form}, vocabulary {plan.vocab_form}"
    if plan.own_form:
        forms += f", the GGUF's own {plan.own_form} blocks for steps of <= {plan.own_rows} rows"
    if plan.own_vocab_form:
        forms += f", its {plan.own_vocab_form} vocabulary for <= {plan.own_vocab_rows} rows"
    if args.enable_torch_compile:  # the note says what the graph leaves out, or why it is off
        forms += f"; compiled step: {runner.compile_note or 'every decode step'}"
    print(f"{steps} decode steps, batch {args.batch}, dtype {dtype.name}, {forms}")
    print(f"step: {step_ms:.2f} ms median ({1e3 / step_ms * args.batch:.1f} tok/s)")
    print_table(rows, ["part", "median_ms", "share", "ops_per_step"])
    common = {"model": args.model, "dtype": dtype.name, "batch": args.batch, "step_ms": step_ms}
    common["compiled"] = runner.model.compiled is not None
    common |= {"linear_form": plan.linear_form, "vocab_form": plan.vocab_form}
    rows = [{**common, "workload": f"decode b={args.batch}", **r} for r in rows]
    print("appended to", append_results("step_profile", rows))


if __name__ == "__main__":
    main()
