"""Speculative drafts on and off in one engine, alternating round by round.

    python -m stemma.bench.drafts_ab --batches 1,8,32,64 --rounds 5
    python -m stemma.bench.drafts_ab --prompt rewrite --batches 1,8
    python -m stemma.bench.drafts_ab --engine '{"enable_torch_compile": true}'

An A/B of two engines (config_ab) holds each in a process of its own, and on this kind of
2-core VM the same engine has run up to about 20% faster in one process than in another
(its memory, its cores' neighbours), a bias no number of rounds removes. Here one engine,
started with `speculative_algorithm: NGRAM`, runs every round twice, with its speculative
draft sources and without them (the constraint's forced text stays), in alternating order,
so both sides share the process, its weights and its kernels; each batch size runs once
untimed first. The prefix cache is flushed
before every run, so that no run drafts the other's answer from it. The draft budget's state
(its cost fit, what recent drafts did) carries across rounds, as in a serving engine.

Per batch size: decode tokens/s with drafts and without (greedy, or seeded sampling at
--temperature; EOS ignored; distinct random 32-token prompts, with --prompt rewrite chat
requests to repeat a paragraph, with --prompt anchors-NAME the anchors' workload NAME),
the median over rounds of the off run's seconds over the on run's (above 1 = drafting
faster) and the share of requests with the same tokens, and the draft tokens each side
proposed (none off).
Results: bench/results/drafts_ab.jsonl.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

from .common import (
    add_decode_rounds,
    append_results,
    bench_parser,
    paired_speedup,
    print_table,
    round_prompts,
)


def main(argv: list[str] | None = None) -> None:
    p = bench_parser(__doc__)
    p.add_argument("--engine", default="{}", help="more engine options, as JSON")
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sample at this temperature (each request seeded by its round and place, the "
        "same seeds on both sides); 0: greedy",
    )
    add_decode_rounds(p, batches="1,8,32,64")
    args = p.parse_args(argv)
    options = json.loads(args.engine)
    if not isinstance(options, dict):
        raise SystemExit(f"--engine must be a JSON object, got {args.engine!r}")
    from ..runtime.engine import Engine

    config = {"dtype": args.dtype, "kv_cache_mb": 512, **options}
    config["speculative_algorithm"] = "NGRAM"
    rows: list[dict[str, Any]] = []
    with Engine(args.model, **config) as engine:
        sources = list(engine.outputs.drafts)
        forced = [s for s in sources if not s.speculative]  # the constraint's, kept on both
        rng = random.Random(0)
        for batch in [int(b) for b in args.batches.split(",")]:
            params = {"max_new_tokens": args.new, "temperature": args.temperature}
            params["ignore_eos"] = True
            times: dict[str, list[float]] = {"on": [], "off": []}
            outs: dict[str, list[list[int]]] = {}
            drafted = {"on": 0, "off": 0}  # draft tokens proposed, all rounds
            same = 0
            # a first run of this batch size, untimed: its one-time costs (new shapes' kernels,
            # the K/V pool's first use) would fall on whichever side ran first
            engine.flush_cache()
            vocab, template = engine.vocab_size, engine.apply_chat_template
            first = round_prompts(args.prompt, batch, -1, vocab, template, rng)
            engine.generate(sampling_params=seeded(params, -1, batch), **first)
            for r in range(args.rounds):
                kwargs = round_prompts(args.prompt, batch, r, vocab, template, rng)
                for side in ("on", "off") if r % 2 == 0 else ("off", "on"):
                    engine.outputs.drafts[:] = sources if side == "on" else forced
                    engine.flush_cache()
                    start = time.perf_counter()
                    res = engine.generate(sampling_params=seeded(params, r, batch), **kwargs)
                    times[side].append(time.perf_counter() - start)
                    outs[side] = [o["output_ids"] for o in res]
                    drafted[side] += sum(
                        o["meta_info"].get("spec_num_proposed_drafts", 0) for o in res
                    )
                same += sum(a == b for a, b in zip(outs["on"], outs["off"]))
            engine.outputs.drafts[:] = sources
            tok = {s: round(batch * args.new / sorted(t)[len(t) // 2], 1) for s, t in times.items()}
            rows.append(
                {
                    "model": args.model,
                    "dtype": engine.dtype.name,
                    "engine": options,
                    "prompt": args.prompt,
                    "temperature": args.temperature,
                    "batch": batch,
                    "new_tokens": args.new,
                    "rounds": args.rounds,
                    "off_tok_s": tok["off"],
                    "on_tok_s": tok["on"],
                    "speedup": round(paired_speedup(times["off"], times["on"]), 3),
                    "same_outputs": round(same / (batch * args.rounds), 3),
                    "drafted_on": drafted["on"],
                    "drafted_off": drafted["off"],
                    "seconds": {s: [round(x, 4) for x in t] for s, t in times.items()},
                }
            )
            print_table(rows[-1:], [k for k in rows[-1] if k not in ("seconds", "engine")])
    print("appended to", append_results("drafts_ab", rows))


def seeded(params: dict[str, Any], r: int, batch: int) -> list[dict[str, Any]]:
    """Each request's sampling params; sampled ones seeded by round and place, so that
    both sides draw with the same seeds (drafts verified exactly keep a seeded request's
    draws: the two sides then differ only where bfloat16 rounds otherwise)."""
    if not params["temperature"]:
        return [params] * batch
    return [{**params, "seed": 1000 * (r + 1) + i} for i in range(batch)]


if __name__ == "__main__":
    main()
