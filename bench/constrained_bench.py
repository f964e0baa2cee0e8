"""Constrained decoding on the engine: verified jump-forward on vs off, and mask overhead.

  python -m stemma.bench.constrained_bench [--objects 8] [--repeats 3]

tool-call: the same prompts and JSON tool-call schema, greedy, one request at a time,
  jump-forward on vs off: forward passes per object and wall time per object (the two
  engines' outputs are also compared). Two prompt styles: "tools in system prompt" describes
  the tools and shows one call, as tool-calling prompts do; "bare request" names the tool in
  the user turn only, so the model has not seen the JSON it must write and spells its keys
  a few characters at a time, tokens the canonical draft cannot predict;
mask overhead: 32 constrained requests in one batch; time spent building and applying the
  grammar bitmasks as a share of step time.
Results: a table and JSON lines in bench/results/constrained_bench.jsonl.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from ..runtime.engine import Engine
from ..runtime.scheduler import output_processor
from .common import EngineProcess, append_results, print_table
from .tool_schemas import TOOL_NAMES, tool_call, weather_args

TOOL_SCHEMA = tool_call(weather_args(max_city_len=24, days={"enum": list(range(1, 8))}), TOOL_NAMES)
CITIES = ["Paris", "Tokyo", "Lima", "Nairobi", "Oslo", "Cairo", "Quito", "Hanoi", "Perth", "Bern"]


SYSTEM = (
    "You call tools by replying with one JSON object and nothing else.\n"
    "Tools:\n"
    '- get_weather(city: string, unit: "celsius" | "fahrenheit", days: 1-7)\n'
    "- get_time(city: string)\n"
    "- search_web(query: string)\n"
    'Example: {"name":"get_weather","arguments":{"city":"Rome","unit":"fahrenheit","days":2}}'
)
PROMPT_STYLES = ("tools in system prompt", "bare request")


def prompts(engine: Engine | EngineProcess, num: int, style: str = PROMPT_STYLES[0]) -> list[str]:
    out = []
    for i in range(num):
        city, days = CITIES[i % len(CITIES)], i % 7 + 1
        if style == "tools in system prompt":
            messages = [
                {"role": "system", "content": SYSTEM},
                {
                    "role": "user",
                    "content": f"What will the weather be in {city} over the next {days} days, "
                    "in celsius?",
                },
            ]
        else:
            messages = [
                {
                    "role": "user",
                    "content": f"Call a tool: the weather in {city} for the next {days} days in "
                    "celsius. Tools: get_weather(city, unit, days).",
                }
            ]
        out.append(engine.apply_chat_template(messages))
    return out


def tool_calls(engine: Engine | EngineProcess, texts: list[str]) -> tuple[list[str], float, float]:
    """(outputs, forward passes per object, seconds per object), one request at a time."""
    params = {"max_new_tokens": 96, "temperature": 0, "json_schema": json.dumps(TOOL_SCHEMA)}
    outs, steps, secs = [], [], []
    for text in texts:
        before = engine.get_metrics()["num_steps"]
        t = time.perf_counter()
        outs.append(engine.generate(text, params)["text"])
        secs.append(time.perf_counter() - t)
        steps.append(engine.get_metrics()["num_steps"] - before)
    return outs, statistics.mean(steps), statistics.median(secs)


def bench_jump_forward(args) -> list[dict[str, Any]]:
    rows = []
    with (  # a process each (EngineProcess says why)
        EngineProcess(args.model, dtype=args.dtype, grammar_backend=args.grammar_backend) as on,
        EngineProcess(
            args.model,
            dtype=args.dtype,
            grammar_backend=args.grammar_backend,
            enable_jump_forward=False,
        ) as off,
    ):
        for engine in (on, off):  # compile the schema once, outside the timings
            engine.generate("{", {"max_new_tokens": 1, "json_schema": json.dumps(TOOL_SCHEMA)})
        for style in PROMPT_STYLES:
            texts = prompts(on, args.objects, style)
            results: dict[bool, list[tuple[list[str], float, float]]] = {True: [], False: []}
            for _ in range(args.repeats):
                for jf, engine in ((True, on), (False, off)):
                    engine.flush_cache()
                    results[jf].append(tool_calls(engine, texts))
            workload = (
                f"tool-call JSON, {style}, {args.objects} objects, greedy, {args.grammar_backend}"
            )
            for metric, idx in (("forward passes per object", 1), ("seconds per object", 2)):
                v_on = statistics.median(r[idx] for r in results[True])
                v_off = statistics.median(r[idx] for r in results[False])
                rows.append(
                    {
                        "workload": workload,
                        "metric": metric,
                        "jump_forward_on": v_on,
                        "jump_forward_off": v_off,
                        "ratio": v_off / v_on,
                    }
                )
            outs_on, outs_off = results[True][0][0], results[False][0][0]
            rows.append(
                {
                    "workload": workload,
                    "metric": "identical outputs on/off",
                    "jump_forward_on": sum(a == b for a, b in zip(outs_on, outs_off)),
                    "jump_forward_off": len(outs_on),
                }
            )
    return rows


def bench_mask_overhead(args) -> list[dict[str, Any]]:
    spent = [0.0]
    real_fill = output_processor.fill_bitmask

    def timed_fill(*a, **kw):
        t = time.perf_counter()
        out = real_fill(*a, **kw)
        spent[0] += time.perf_counter() - t
        return out

    with Engine(args.model, dtype=args.dtype, grammar_backend=args.grammar_backend) as engine:
        texts = prompts(engine, 32)
        params = {"max_new_tokens": 64, "temperature": 0, "json_schema": json.dumps(TOOL_SCHEMA)}
        engine.generate(texts[0], {**params, "max_new_tokens": 1})
        engine.flush_cache()
        output_processor.fill_bitmask = timed_fill
        try:
            t = time.perf_counter()
            engine.generate(texts, params)
            total = time.perf_counter() - t
        finally:
            output_processor.fill_bitmask = real_fill
    return [
        {
            "workload": f"32 constrained requests in one batch, {args.grammar_backend}",
            "metric": "mask share of time",
            "jump_forward_on": spent[0] / total,
        }
    ]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--objects", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--grammar-backend", default="outlines", choices=["outlines", "llguidance"])
    args = p.parse_args(argv)
    rows = [
        {"model": args.model, "dtype": args.dtype, **r}
        for r in bench_jump_forward(args) + bench_mask_overhead(args)
    ]
    print_table(rows, ["workload", "metric", "jump_forward_on", "jump_forward_off", "ratio"])
    print("appended to", append_results("constrained_bench", rows))


if __name__ == "__main__":
    main()
