"""Grammar mask time per request per step, and what a constraint adds to an engine step.

    python -m stemma.bench.mask_bench --data ../shared/data/jsonschemabench/sample.jsonl

masks: for each grammar backend, real-world schemas (the JSONSchemaBench sample, those the
  backend compiles and that have a valid instance) are walked along their valid instance's
  tokens, as decoding would walk them; every step fills the bitmask rows of the batch with the
  engine's own `fill_bitmask` and accepts one token per row. Batch 1 walks one schema at a
  time; batch 64 walks 64 requests (the schemas in turn) in lockstep. Reported: p50 / p99 of
  the time per request per step (a batch step's time over its active rows) at SmolLM2's
  49,152-token vocabulary. --property-order any walks them with keys in any order (the key
  rules and uniqueItems beside the grammar, llguidance only; --masks-only skips the step).
step: the same 32 prompts decoded for 64 tokens, constrained (a JSON array of tool calls that
  cannot close within 64 tokens, so every run does the same steps; with early closing, whose
  searches find nothing here, its worst case, and without) and unconstrained with ignore_eos;
  jump-forward off; interleaved rounds, the ratios of run times (median over rounds). Each
  run's time in the model's forward is measured apart: the forwards' ratio (the same shapes
  and work on both sides: near 1 unless the constraint slows the model) and the constraint's
  own share of the step, the time outside the forwards beyond the plain run's over the plain
  run's time (median over rounds). On a shared machine whose speed swings by more than the
  target from run to run, the share is the steadier measure.
Results: a table and JSON lines in bench/results/mask_bench.jsonl.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from .common import append_results, interleaved_times, paired_speedup, print_table
from .tool_schemas import TOOL_NAMES, tool_call, weather_args

MODEL = "smollm2-135m"
# An array of tool calls with at least 100 items: no output closes it within the step bench.
LONG_SCHEMA = {
    "type": "array",
    "minItems": 100,
    "items": tool_call(weather_args(("city", "days"), required=("city",)), TOOL_NAMES),
}


def walks(
    backend: str,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    limit: int,
    property_order: str = "schema",
) -> list[tuple[Any, list[int]]]:
    """(compiled handle, valid instance's token ids) for up to `limit` schemas."""
    from ..runtime.constrained.backend import create_backend
    from ..runtime.constrained.spec import ConstraintSpec
    from ..runtime.constrained.vocabulary import CompileLimits

    service = create_backend(backend, tokenizer, limits=CompileLimits(timeout_s=10.0))
    out = []
    for row in rows:
        valid = [t["data"] for t in row["tests"] if t["valid"]]
        if not valid:
            continue
        spec = ConstraintSpec.create(json_schema=row["schema"], property_order=property_order)
        handle = service.submit(spec)
        if not handle.wait(30) or handle.error is not None:
            continue
        text = json.dumps(valid[0], separators=(",", ":"), ensure_ascii=False)
        ids = tokenizer.encode(text)
        matcher = handle.matcher()
        if all(_accept(matcher, t) for t in ids):  # the backend takes the instance whole
            out.append((handle, ids))
        if len(out) == limit:
            break
    return out


def _accept(matcher: Any, token: int) -> bool:
    if not matcher.allows(token):
        return False
    matcher.accept_token(token)
    return True


def step_times(walk_set: list[tuple[Any, list[int]]], batch: int, vocab: int) -> list[float]:
    """Seconds per request per step over every step of every batch."""
    from ..runtime.constrained.matcher import fill_bitmask

    per_request: list[float] = []
    for start in range(0, len(walk_set), batch) if batch == 1 else [0]:
        chosen = [walk_set[(start + i) % len(walk_set)] for i in range(batch)]
        matchers = [h.matcher() for h, _ in chosen]
        out = None
        for pos in range(max(len(ids) for _, ids in chosen)):
            live = [m if pos < len(ids) else None for m, (_, ids) in zip(matchers, chosen)]
            t = time.perf_counter()
            out = fill_bitmask(live, vocab, out)
            per_request.append((time.perf_counter() - t) / sum(m is not None for m in live))
            for m, (_, ids) in zip(matchers, chosen):
                if pos < len(ids):
                    m.accept_token(ids[pos])
    return per_request


def bench_masks(args: argparse.Namespace) -> list[dict[str, Any]]:
    from ..runtime.models.loader import resolve_checkpoint
    from ..runtime.tokenizer import Tokenizer

    tokenizer = Tokenizer(resolve_checkpoint(MODEL))
    rows = [json.loads(line) for line in args.data.open()]
    results = []
    for backend in args.backends.split(","):
        if args.property_order != "schema" and backend != "llguidance":
            continue  # keys in any order: llguidance only
        walk_set = walks(backend, tokenizer, rows, args.schemas, args.property_order)
        for batch in (1, 64):
            ts = sorted(step_times(walk_set, batch, tokenizer.vocab_size))
            results.append(
                {
                    "bench": "masks",
                    "backend": backend,
                    "property_order": args.property_order,
                    "batch": batch,
                    "schemas": len(walk_set),
                    "steps": len(ts),
                    "p50_ms": round(1e3 * ts[len(ts) // 2], 4),
                    "p99_ms": round(1e3 * ts[min(len(ts) - 1, int(0.99 * len(ts)))], 4),
                }
            )
    return results


def bench_step(args: argparse.Namespace) -> list[dict[str, Any]]:
    from ..runtime.engine import Engine

    results = []
    # jump-forward off: both runs then do exactly the same 64 decode steps
    engine_args = {"grammar_backend": args.step_backend, "enable_jump_forward": False}
    with Engine(MODEL, dtype=args.dtype, **engine_args) as engine:
        texts = [
            engine.apply_chat_template([{"role": "user", "content": f"List tool calls, case {i}."}])
            for i in range(32)
        ]
        plain = {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}
        constrained = {"max_new_tokens": 64, "temperature": 0, "json_schema": LONG_SCHEMA}
        unclosed = {**constrained, "close_early": False}
        counts: dict[str, list[int]] = {"plain": [], "constrained": [], "unclosed": []}
        forward_s: dict[str, list[float]] = {"plain": [], "constrained": [], "unclosed": []}
        in_forward = _time_forwards(engine)

        def run(name: str, params: dict[str, Any]) -> None:
            engine.flush_cache()
            in_forward[0] = 0.0
            outs = engine.generate(texts, params)
            forward_s[name].append(in_forward[0])
            counts[name].append(sum(o["meta_info"]["completion_tokens"] for o in outs))

        run("constrained", constrained)  # compiles the schema once, before the clock
        counts["constrained"].clear()
        forward_s["constrained"].clear()
        fns = {
            "plain": lambda: run("plain", plain),
            "constrained": lambda: run("constrained", constrained),
            "unclosed": lambda: run("unclosed", unclosed),
        }
        times = interleaved_times(fns, args.rounds)
    assert counts["plain"] == counts["constrained"] == counts["unclosed"], counts  # same steps
    results.append(
        {
            "bench": "step",
            "backend": args.step_backend,
            "batch": 32,
            "tokens_per_run": counts["plain"][0],
            "plain_s": round(statistics.median(times["plain"]), 3),
            "constrained_s": round(statistics.median(times["constrained"]), 3),
            "unclosed_s": round(statistics.median(times["unclosed"]), 3),
            # medians over rounds of constrained / plain seconds (early closing on, off)
            "constrained_over_plain": round(
                paired_speedup(times["constrained"], times["plain"]), 4
            ),
            "unclosed_over_plain": round(paired_speedup(times["unclosed"], times["plain"]), 4),
            # the model's forwards alone, constrained / plain (the same work on both sides)
            "forward_ratio": round(paired_speedup(forward_s["constrained"], forward_s["plain"]), 4),
            "unclosed_forward_ratio": round(
                paired_speedup(forward_s["unclosed"], forward_s["plain"]), 4
            ),
            # the time outside the forwards beyond the plain run's, over the plain run's time
            "constraint_share": _share(times, forward_s, "constrained"),
            "unclosed_share": _share(times, forward_s, "unclosed"),
        }
    )
    return results


def _time_forwards(engine: Any) -> list[float]:
    """Seconds in the model's forward since last reset ([0]), summed by the engine's thread."""
    total = [0.0]
    forward = engine.core.runner.forward

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return forward(*args, **kwargs)
        finally:
            total[0] += time.perf_counter() - start

    engine.core.runner.forward = timed  # the instance's: the engine core calls it per step
    return total


def _share(times: dict[str, list[float]], forward_s: dict[str, list[float]], name: str) -> float:
    """Median over rounds of (outside the forwards, `name` - plain) / plain run's time."""
    rounds = zip(times[name], forward_s[name], times["plain"], forward_s["plain"], strict=True)
    return round(statistics.median(((t - f) - (tp - fp)) / tp for t, f, tp, fp in rounds), 4)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", type=Path, required=True, help="MaskBench-style JSONL")
    ap.add_argument("--backends", default="llguidance,outlines")
    ap.add_argument("--schemas", type=int, default=40, help="schemas walked per backend")
    ap.add_argument("--step-backend", default="llguidance")
    ap.add_argument("--property-order", default="schema", help='the masks\' ("any": llguidance)')
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--masks-only", action="store_true", help="no engine step")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args(argv)
    masks = bench_masks(args)
    columns = ["backend", "property_order", "batch", "schemas", "steps", "p50_ms", "p99_ms"]
    print_table(masks, columns)
    step = [] if args.masks_only else bench_step(args)
    columns = ["backend", "batch", "tokens_per_run", "plain_s", "constrained_s", "unclosed_s"]
    if step:
        ratios = ["constrained_over_plain", "unclosed_over_plain", "forward_ratio"]
        print_table(step, [*columns, *ratios, "constraint_share", "unclosed_share"])
    if not args.no_record:
        append_results("mask_bench", masks + step, data=args.data.name)


if __name__ == "__main__":
    main()
