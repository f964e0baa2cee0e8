"""Engine benchmarks against HF transformers on the same weights and dtype, side by side.

  python -m stemma.bench.engine_bench [--workloads decode,fanout,stream] [--repeats 3]

decode: tokens/s at batch 1/8/32 (engine vs HF batched generate); the ratio is the median of
        per-round ratios (each round runs both, adjacent in time), the ratio of the two
        medians is kept beside it;
fanout: one ~1000-token system prompt, 64 questions, 32 new tokens each (engine vs the engine
        with the radix cache off vs HF generate one request at a time);
stream: TTFT / TPOT p50 and p99 under Poisson arrivals.
Results: a table on stdout and JSON lines in bench/results/engine_bench.jsonl.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from typing import Any

import torch

from ..runtime.dtype_policy import DTYPES
from ..runtime.engine import Engine
from ..runtime.models.loader import resolve_checkpoint
from .common import (
    append_results,
    interleaved_medians,
    interleaved_times,
    median_time,
    paired_speedup,
    print_table,
)

SYSTEM = (
    "You are a meticulous assistant for a team of engineers. Answer precisely, cite the "
    "relevant section of the handbook, and never invent facts. "
)


def hf_model(model: str, dtype: str, device: str = "cpu"):
    from transformers import AutoModelForCausalLM

    ckpt = resolve_checkpoint(model)
    hf = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=DTYPES[dtype])
    return hf.to(device).eval()


def hf_generate(hf, prompts: list[list[int]], new_tokens: int) -> None:
    """Batched greedy generate, left-padded, fixed length (no early EOS)."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=hf.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=hf.device)
    with torch.inference_mode():
        hf.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )


def greedy(new_tokens: int) -> dict[str, Any]:
    return {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}


def generate_checked(engine: Engine, prompts: list[list[int]], new_tokens: int) -> None:
    """engine.generate, failing the bench unless every request wrote all its tokens (a failed
    step must not be timed as a fast one)."""
    outs = engine.generate(input_ids=prompts, sampling_params=greedy(new_tokens))
    for out in outs if isinstance(outs, list) else [outs]:
        meta = out["meta_info"]
        if meta["completion_tokens"] != new_tokens:
            raise RuntimeError(f"a request wrote {meta['completion_tokens']} of {new_tokens} "
                               f"tokens: {meta['finish_reason']}")  # fmt: skip


def bench_decode(engine: Engine, hf, args) -> list[dict[str, Any]]:
    rng = random.Random(0)
    rows = []
    for batch in args.batches:
        prompts = [[rng.randrange(100, 40000) for _ in range(32)] for _ in range(batch)]
        n = args.new_tokens

        def run_engine(prompts: list[list[int]] = prompts) -> None:
            engine.flush_cache()
            generate_checked(engine, prompts, args.new_tokens)

        def run_hf(prompts: list[list[int]] = prompts) -> None:
            hf_generate(hf, prompts, args.new_tokens)

        steal: dict[str, list[float]] = {}
        t = interleaved_times({"engine": run_engine, "hf": run_hf}, args.repeats, steal)
        t_engine, t_hf = statistics.median(t["engine"]), statistics.median(t["hf"])
        rows.append(
            {
                "workload": f"decode b={batch} in=32 out={n}",
                "metric": "tokens/s",
                "stemma": batch * n / t_engine,
                "hf": batch * n / t_hf,
                "ratio": paired_speedup(t["hf"], t["engine"]),
                "ratio_of_medians": t_hf / t_engine,
                "rounds": args.repeats,
                "round_seconds": {k: [round(x, 3) for x in v] for k, v in t.items()},
                "round_cpu_steal": steal,
            }
        )
    return rows


def fanout_prompts(engine: Engine, num: int) -> tuple[list[int], list[list[int]]]:
    rng = random.Random(1)
    system = engine.tokenize(SYSTEM * 40)[:1000]
    questions = [
        engine.tokenize(
            f" Question {i}: what does rule {rng.randrange(999)} say "
            f"about release {rng.randrange(99)}?"
        )[:20]
        for i in range(num)
    ]
    return system, [system + q for q in questions]


def bench_fanout(engine: Engine, nocache: Engine, hf, args) -> list[dict[str, Any]]:
    system, prompts = fanout_prompts(engine, 64)
    n = 32

    def run(e: Engine) -> None:
        e.flush_cache()
        generate_checked(e, prompts, n)

    t = interleaved_medians(
        {"engine": lambda: run(engine), "nocache": lambda: run(nocache)}, args.repeats
    )
    t_engine, t_nocache = t["engine"], t["nocache"]
    # HF one request at a time: time a sample of requests, scale to all 64.
    sample = prompts[: args.hf_fanout_sample]
    t_hf_sample, _ = median_time(lambda: [hf_generate(hf, [p], n) for p in sample], 1)
    t_hf = t_hf_sample * len(prompts) / len(sample)
    wl = f"fanout 64 x (1000 shared + 20) out={n}"
    return [
        {
            "workload": wl,
            "metric": "seconds",
            "stemma": t_engine,
            "baseline": "hf sequential",
            "hf": t_hf,
            "ratio": t_hf / t_engine,
        },
        {
            "workload": wl,
            "metric": "seconds",
            "stemma": t_engine,
            "baseline": "radix cache off",
            "nocache": t_nocache,
            "ratio": t_nocache / t_engine,
        },
    ]


def bench_stream(engine: Engine, args) -> list[dict[str, Any]]:
    """Poisson arrivals; per-request TTFT and TPOT from the engine's own metrics."""
    rng = random.Random(2)
    engine.flush_cache()
    before = engine.get_metrics()
    threads = []
    for _ in range(args.stream_requests):
        prompt = [rng.randrange(100, 40000) for _ in range(rng.randrange(64, 256))]
        t = threading.Thread(
            target=engine.generate, kwargs={"input_ids": prompt, "sampling_params": greedy(32)}
        )
        t.start()
        threads.append(t)
        time.sleep(rng.expovariate(args.stream_rate))
    for t in threads:
        t.join()
    after = engine.get_metrics()
    k = len(before["ttft"])
    ttft, tpot = after["ttft"][k:], after["tpot"][len(before["tpot"]) :]
    wl = f"stream {args.stream_requests} req, rate {args.stream_rate}/s, in 64-256, out 32"

    def pct(xs: list[float], q: float) -> float:
        return statistics.quantiles(xs, n=100)[q - 1] if len(xs) > 1 else xs[0]

    return [
        {"workload": wl, "metric": m, "stemma": v}
        for m, v in (
            ("ttft_p50_s", pct(ttft, 50)),
            ("ttft_p99_s", pct(ttft, 99)),
            ("tpot_p50_s", pct(tpot, 50)),
            ("tpot_p99_s", pct(tpot, 99)),
        )
    ]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--workloads", default="decode,fanout,stream")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--batches", type=lambda v: [int(b) for b in v.split(",")], default=[1, 8, 32])
    p.add_argument("--hf-fanout-sample", type=int, default=8)
    p.add_argument("--stream-requests", type=int, default=48)
    p.add_argument("--stream-rate", type=float, default=4.0)
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--device", default="cpu", help="cpu or cuda (HF runs on the same device)")
    p.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"])
    args = p.parse_args(argv)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    workloads = args.workloads.split(",")
    rows: list[dict[str, Any]] = []
    options = {
        "dtype": args.dtype,
        "kv_cache_mb": 1024,
        "device": args.device,
        "attention_backend": args.attention_backend,
    }
    common: dict[str, Any] = {"model": args.model, **options}
    if args.device.startswith("cuda"):
        common["gpu"] = torch.cuda.get_device_name(args.device)
    with Engine(args.model, **options) as engine:
        common["dtype"] = engine.dtype.name
        common["attention_backend"] = engine.config.resolved_attention_backend
        needs_hf = {"decode", "fanout"} & set(workloads)
        hf = hf_model(args.model, engine.dtype.name, args.device) if needs_hf else None
        if "decode" in workloads:
            rows += bench_decode(engine, hf, args)
        if "fanout" in workloads:
            with Engine(args.model, **options, disable_radix_cache=True) as nocache:
                rows += bench_fanout(engine, nocache, hf, args)
        if "stream" in workloads:
            rows += bench_stream(engine, args)
    rows = [{**common, **r} for r in rows]
    print_table(
        rows, ["workload", "metric", "stemma", "hf", "nocache", "ratio", "ratio_of_medians"]
    )
    print("appended to", append_results("engine_bench", rows))


if __name__ == "__main__":
    main()
