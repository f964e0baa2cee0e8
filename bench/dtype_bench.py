"""dtype "auto" against every explicit dtype, and weight-only int8 / int4, on this CPU.

  python -m stemma.bench.dtype_bench [--repeats 5]
      [--configs auto,float32,bfloat16,int8,int4,w8a8_int8,none] [--hf-dtypes float32,bfloat16]

Workloads (greedy, EOS ignored so every config does the same work):
  decode1:    one request, 50-token prompt, 128 new tokens (single-stream decode)
  decode8:    8 requests at once, 50-token prompts, 64 new tokens
  parallel32: 32 requests at once, distinct 200-token prompts, 64 new tokens
Every config is one Engine in a process of its own; each round runs every config once, in
alternating order, so machine drifts hit all alike. Reported per workload: the median
seconds of each config, and the median over rounds of auto's time over the fastest
explicit dtype's in the same round ("auto_vs_best": 1.0 = as fast, 1.05 = 5% slower).
int8 / int4 / w8a8_int8 run on auto's dtype, quantized; "none" is auto's dtype with a
quantized GGUF dequantized (auto itself multiplies decode steps by the file's own 4-bit
blocks where they measured faster). Their accuracy is `--accuracy`: teacher-forced top-1
agreement with float32 over a prompt set and the perplexity of a fixed text, beside the
same of HF transformers on the same (converted) checkpoint in each of --hf-dtypes.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch

from ..runtime.dtype_policy import auto_dtype, cpu_has_native_bf16, cpu_isa
from ..runtime.models.loader import resolve_checkpoint
from .common import EngineProcess, append_results, interleaved_times, print_table

EXPLICIT = ("float32", "bfloat16")
QUANTIZED = ("int8", "int4", "w8a8_int8", "none")
STORY = (
    "The lighthouse keeper climbed the spiral stairs each evening, counting the steps "
    "aloud, polishing the great lens, and writing the weather into a leather log book. "
)
ACCURACY_PROMPTS = [
    "The capital of France is Paris, and the capital of Germany is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    '{"name": "get_weather", "arguments": {"city": "Berlin", "unit":',
    "Photosynthesis is the process by which green plants use sunlight to",
    "To make a cup of tea, first boil the water, then",
    "The three primary colors are red, blue and",
]


def engine_kwargs(config: str) -> dict[str, Any]:
    if config in QUANTIZED:
        return {"dtype": "auto", "quantization": config}
    return {"dtype": config}


def prompt_ids(engine: EngineProcess, n_tokens: int, salt: int) -> list[int]:
    ids = engine.tokenize(f"Story {salt}: " + STORY * (n_tokens // 30 + 2))
    return ids[:n_tokens]


def workload(engine: EngineProcess, name: str) -> None:
    shape = {"decode1": (1, 50, 128), "decode8": (8, 50, 64), "parallel32": (32, 200, 64)}
    batch, prompt_len, new = shape[name]
    prompts = [prompt_ids(engine, prompt_len, i) for i in range(batch)]
    params = {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}
    engine.generate(input_ids=prompts, sampling_params=params)
    engine.flush_cache()  # each round prefills again


def accuracy(
    engines: dict[str, EngineProcess], reference: EngineProcess, ckpt: str, hf_dtypes: list[str]
) -> list[dict[str, Any]]:
    """Teacher-forced agreement with `reference` (float32) and perplexity on STORY, for each
    engine and for HF transformers in each of hf_dtypes (on the checkpoint directory ckpt)."""
    fields = {"return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 1}
    params = {"max_new_tokens": 1, "temperature": 0}
    prompts = [reference.tokenize(p) for p in ACCURACY_PROMPTS]
    story = reference.tokenize(STORY * 4)

    def measure(engine: EngineProcess) -> tuple[list[int], float]:
        outs = engine.generate(input_ids=prompts, sampling_params=params, **fields)
        tops = [t[0][1] for o in outs for t in o["meta_info"]["input_top_logprobs"][1:]]
        [out] = engine.generate(input_ids=[story], sampling_params=params, **fields)
        lps = [lp[0] for lp in out["meta_info"]["input_token_logprobs"][1:]]
        return tops, float(torch.tensor(lps).mean().neg().exp())

    ref_tops, ref_ppl = measure(reference)
    measured = {name: measure(engine) for name, engine in engines.items()}
    for dtype in hf_dtypes:
        measured[f"hf_{dtype}"] = hf_measure(ckpt, dtype, prompts, story)
    rows = []
    for name, (tops, ppl) in measured.items():
        agree = sum(a == b for a, b in zip(tops, ref_tops)) / len(ref_tops)
        rows.append(
            {
                "workload": "accuracy",
                "config": name,
                "top1_agreement_vs_float32": round(agree, 4),
                "perplexity": round(ppl, 3),
                "perplexity_float32": round(ref_ppl, 3),
            }
        )
    return rows


def hf_measure(
    ckpt: str, dtype: str, prompts: list[list[int]], story: list[int]
) -> tuple[list[int], float]:
    """HF transformers' teacher-forced top-1 tokens over `prompts` and perplexity of `story`,
    on the checkpoint directory stemma reads (a GGUF's float32 conversion), in `dtype`."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=getattr(torch, dtype)).eval()
    with torch.inference_mode():
        tops = [t for ids in prompts for t in hf(torch.tensor([ids])).logits[0, :-1].argmax(-1)]
        logits = hf(torch.tensor([story])).logits[0, :-1].float()
    lps = logits.log_softmax(-1).gather(1, torch.tensor(story[1:])[:, None])
    return [int(t) for t in tops], float(lps.mean().neg().exp())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m stemma.bench.dtype_bench")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--configs", default="auto,float32,bfloat16,int8,int4,w8a8_int8")
    p.add_argument("--workloads", default="decode1,decode8,parallel32")
    p.add_argument("--accuracy", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--hf-dtypes", default="float32,bfloat16", help="HF's accuracy beside ours")
    args = p.parse_args(argv)
    configs = args.configs.split(",")
    # a process each (bench/common.EngineProcess says why)
    engines = {c: EngineProcess(args.model, kv_cache_mb=512, **engine_kwargs(c)) for c in configs}
    machine = {
        "cpu_isa": cpu_isa(),
        "native_bf16": cpu_has_native_bf16(),
        "auto_dtype": auto_dtype("cpu").name,
    }
    try:
        for name in args.workloads.split(","):
            for engine in engines.values():  # warm-up: first-call costs stay out of rounds
                workload(engine, name)
            fns = {c: (lambda e=e, n=name: workload(e, n)) for c, e in engines.items()}
            times = interleaved_times(fns, args.repeats)
            row: dict[str, Any] = {"workload": name, "rounds": args.repeats, **machine}
            row.update({f"{c}_s": round(statistics.median(t), 3) for c, t in times.items()})
            row["seconds"] = {c: [round(x, 3) for x in t] for c, t in times.items()}
            explicit = [c for c in EXPLICIT if c in times]
            if "auto" in times and explicit:
                per_round = [
                    times["auto"][r] / min(times[c][r] for c in explicit)
                    for r in range(args.repeats)
                ]
                row["auto_vs_best"] = round(statistics.median(per_round), 3)
            append_results("dtype_bench", [{"model": args.model, **row}])  # each as it ends
            print_table([row], [k for k in row if k != "seconds"])
        if args.accuracy and "float32" in engines:
            others = {c: e for c, e in engines.items() if c in ("auto", "bfloat16", *QUANTIZED)}
            hf_dtypes = [d for d in args.hf_dtypes.split(",") if d]
            ckpt = str(resolve_checkpoint(args.model))
            acc = accuracy(others, engines["float32"], ckpt, hf_dtypes)
            append_results("dtype_bench", [{"model": args.model, **r, **machine} for r in acc])
            print_table(acc, list(acc[0]))
    finally:
        for engine in engines.values():
            engine.shutdown()
    print("appended to bench/results/dtype_bench.jsonl")


if __name__ == "__main__":
    main()
