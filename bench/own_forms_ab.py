"""What the few-rows forms of dtype "auto" are worth on this CPU: one engine, its decode steps
timed with a GGUF's own forms for steps of few rows (as the plan chose them) against the same
engine with those forms swapped for the ones the other steps use, interleaved.

    python -m stemma.bench.own_forms_ab [--part vocab|linears] [--batches 1,2] [--rounds 5]

`--part vocab`: the vocabulary projection's per-row int8 (a Q8_0 vocabulary) against its
vocabulary form; `--part linears`: the linears' int4 blocks against their linear form. Each
round runs both, in alternating order, over the same requests (greedy, EOS ignored); a row
reports the median decode step of each and the median over rounds of off / on (above 1: the
few-rows form is faster). The forms are swapped in place, so both sides share the weights,
the cache and every other choice of the plan.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from ..runtime.config import EngineConfig
from ..runtime.dtype_policy import resolve_dtype
from ..runtime.engine_core import build_core, load_runner
from ..runtime.models.layers import Linear
from ..runtime.models.loader import resolve_checkpoint
from ..runtime.models.weights.few_rows import FewRowsWeight
from .common import append_results, bench_parser, paired_speedup, print_table
from .step_profile import add_requests


def main(argv: list[str] | None = None) -> None:
    p = bench_parser(__doc__)
    p.add_argument("--part", choices=["vocab", "linears"], default="vocab")
    p.add_argument("--batches", default="1,2")
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    cfg = EngineConfig(model=args.model, dtype=args.dtype, kv_cache_mb=256)
    dtype = resolve_dtype(cfg.dtype, cfg.device)
    loaded, runner, plan = load_runner(cfg, str(resolve_checkpoint(cfg.model)), dtype)
    vocab = loaded.config.vocab_size
    core = build_core(cfg, runner, loaded.tokenizer, vocab)
    model = runner.model
    if args.part == "vocab":
        linears = [model.lm_head]
    else:
        linears = [m for m in model.layers.modules() if isinstance(m, Linear)]
    few = {m: m.form for m in linears if isinstance(m.form, FewRowsWeight)}
    if not few:
        raise SystemExit(f"no few-rows {args.part} forms in this plan: {plan.reason}")

    def steps(batch: int) -> float:
        """The median decode step of `batch` requests, in seconds."""
        add_requests(core, loaded.tokenizer, batch, args.new_tokens, vocab)
        core.step()  # the prefill
        times = []
        while core.scheduler.has_work:
            t = time.perf_counter()
            core.step()
            times.append(time.perf_counter() - t)
        core.scheduler.flush_cache()
        return statistics.median(times)

    def hold(on: bool) -> None:
        for m, form in few.items():
            m.form = form if on else form.many

    rows: list[dict[str, Any]] = []
    for batch in [int(b) for b in args.batches.split(",")]:
        steps(batch)  # warm-up
        times: dict[str, list[float]] = {"on": [], "off": []}
        for r in range(args.rounds):
            for side in ("on", "off") if r % 2 == 0 else ("off", "on"):
                hold(side == "on")
                times[side].append(steps(batch))
        hold(True)
        rows.append(
            {
                "part": args.part,
                "batch": batch,
                "limit_rows": next(iter(few.values())).max_rows,
                "on_step_ms": round(statistics.median(times["on"]) * 1e3, 2),
                "off_step_ms": round(statistics.median(times["off"]) * 1e3, 2),
                "speedup": round(paired_speedup(times["off"], times["on"]), 3),
                "on_ms": [round(t * 1e3, 2) for t in times["on"]],
                "off_ms": [round(t * 1e3, 2) for t in times["off"]],
            }
        )
    print(plan.reason)
    print_table(rows, ["part", "batch", "limit_rows", "on_step_ms", "off_step_ms", "speedup"])
    extra = {"model": args.model, "dtype": dtype.name, "plan": plan.reason}
    print("appended to", append_results("own_forms_ab", rows, **extra))


if __name__ == "__main__":
    main()
