"""Tensor and data parallelism on this machine.

tp: the same decode workload (8 requests, ~40-token prompts, 32 new tokens, greedy) at tp_size
1 and 3 (SmolLM2-135M has 9 query and 3 KV heads, so 2 does not divide it); seconds per engine
step, all-reduces and gathers per step, and memory per rank (weights and KV pool bytes of rank
0's shard, RSS of every rank's process).
tp2: random float32 weights in SmolLM2-135M's shape except for heads that 2 divides (8 query
heads of 72, 4 KV heads); prefill (8 x 64-token prompts) and decode (8 requests) step times at
tp_size 1 with 1 and 2 threads and at tp_size 2 with 1 thread per rank, medians of interleaved
rounds; all-reduces per step and weights / KV pool per rank.
dp: 4 shared prefixes x 8 requests through `stemma serve --dp-size 2` (sglang-router,
cache_aware) and through one `stemma serve`; every response checked, cache-hit share and
throughput of each.

    python -m stemma.bench.parallel_bench --part tp
    python -m stemma.bench.parallel_bench --part tp2
    python -m stemma.bench.parallel_bench --part dp
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .common import append_results, interleaved_times, print_table, rss_mb

PROMPT = "Write one sentence about the number {i}. " * 4


def bench_tp(model: str, dtype: str, steps_rounds: int, sizes: list[int]) -> list[dict[str, Any]]:
    from stemma.runtime.engine import Engine

    rows = []
    for tp in sizes:
        with Engine(model, dtype=dtype, tp_size=tp, max_total_tokens=4096) as engine:
            prompts = [PROMPT.format(i=i) for i in range(8)]
            sp = {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}
            engine.generate(prompts[:1], {**sp, "max_new_tokens": 4})  # warm-up
            group = engine.runner.model.tp
            times = []
            for _ in range(steps_rounds):
                engine.flush_cache()
                m0, ar0, g0 = (
                    engine.get_metrics()["num_steps"],
                    group.num_all_reduce,
                    group.num_gather,
                )
                t0 = time.perf_counter()
                outs = engine.generate(prompts, sp)
                times.append(time.perf_counter() - t0)
            steps = engine.get_metrics()["num_steps"] - m0
            model_ = engine.runner.model
            weights = sum(p.numel() * p.element_size() for p in model_.parameters())
            pool = engine.runner.kv_pool
            kv = sum(t.numel() * t.element_size() for t in pool.k + pool.v)
            pids = [os.getpid(), *(engine.tp.pids.values() if engine.tp else [])]
            rows.append({
                "bench": "tp", "model": model, "dtype": dtype, "tp_size": tp,
                "workload": "8 req x 32 in / 32 out, greedy", "rounds": steps_rounds,
                "seconds": min(times), "steps": steps,
                "ms_per_step": 1000 * min(times) / steps,
                "all_reduce_per_step": (group.num_all_reduce - ar0) / steps,
                "gather_per_step": (group.num_gather - g0) / steps,
                "weights_mb_rank0": weights / 2**20, "kv_pool_mb_rank0": kv / 2**20,
                "kv_slots": pool.num_slots, "rss_mb_per_rank": [round(rss_mb(p)) for p in pids],
                "output_ids": [o["output_ids"] for o in outs],
            })  # fmt: skip
    first = rows[0].pop("output_ids")
    for row in rows[1:]:
        row["same_ids_as_tp1"] = row.pop("output_ids") == first
    return rows


def build_even_model(out: Path) -> Path:
    """SmolLM2-135M's tokenizer and dimensions (hidden 576, intermediate 1536, 30 layers,
    vocab 49152, tied embedding) with 8 query heads of 72 and 4 KV heads; random weights."""
    import torch
    from safetensors.torch import save_file
    from stemma.runtime.models.loader import resolve_checkpoint

    src = resolve_checkpoint("smollm2-135m")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((src / name).read_bytes())
    cfg = json.loads((src / "config.json").read_text())
    cfg |= {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 72}
    (out / "config.json").write_text(json.dumps(cfg))
    hidden, inter, kv = cfg["hidden_size"], cfg["intermediate_size"], 4 * 72
    shapes = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (kv, hidden),
              "self_attn.v_proj": (kv, hidden), "self_attn.o_proj": (hidden, hidden),
              "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
              "mlp.down_proj": (hidden, inter)}  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    tensors = {"model.embed_tokens.weight": torch.randn(cfg["vocab_size"], hidden, generator=gen),
               "model.norm.weight": torch.ones(hidden)}  # fmt: skip
    for i in range(cfg["num_hidden_layers"]):
        for name, shape in shapes.items():
            tensors[f"model.layers.{i}.{name}.weight"] = 0.02 * torch.randn(*shape, generator=gen)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"model.layers.{i}.{norm}.weight"] = torch.ones(hidden)
    save_file(tensors, str(out / "model.safetensors"))
    return out


TP2_CONFIGS = {"tp1 x 1 thread": (1, 1), "tp1 x 2 threads": (1, 2), "tp2 x 1 thread": (2, 1)}


def engine_process(conn: Any, model: str, tp: int, threads: int) -> None:
    """One configuration in a process of its own (its own torch threads): runs each
    (prompts, max_new_tokens) it receives on an empty cache and sends back its seconds, engine
    steps, collectives and ids; None ends it."""
    from stemma.runtime.engine import Engine

    opts = dict(dtype="float32", max_total_tokens=4096, num_threads=threads)
    with Engine(model, tp_size=tp, **opts) as engine:
        runner, pids = engine.runner, [os.getpid(), *(engine.tp.pids.values() if engine.tp else [])]
        conn.send({
            "weights_mb_per_rank": sum(p.numel() * p.element_size()
                                       for p in runner.model.parameters()) / 2**20,
            "kv_pool_mb_per_rank": sum(t.numel() * t.element_size()
                                       for t in runner.kv_pool.k + runner.kv_pool.v) / 2**20,
            "kv_slots": runner.kv_pool.num_slots,
        })  # fmt: skip
        group = runner.model.tp
        while (job := conn.recv()) is not None:
            prompts, new = job
            engine.flush_cache()
            steps, ar, g = engine.get_metrics()["num_steps"], group.num_all_reduce, group.num_gather
            t = time.perf_counter()
            outs = engine.generate(input_ids=prompts, sampling_params={
                "temperature": 0, "ignore_eos": True, "max_new_tokens": new})  # fmt: skip
            conn.send({"seconds": time.perf_counter() - t,
                       "steps": engine.get_metrics()["num_steps"] - steps,
                       "all_reduce": group.num_all_reduce - ar, "gather": group.num_gather - g,
                       "ids": [o["output_ids"] for o in outs],
                       "rss_mb_per_rank": [round(rss_mb(pid)) for pid in pids]})  # fmt: skip


def bench_tp2(rounds: int) -> list[dict[str, Any]]:
    """tp 1 (1 and 2 threads) vs tp 2 (1 thread a rank) on build_even_model: the three run
    side by side, each in its own process, and take turns (bench.common.interleaved_times)."""
    import torch
    import torch.multiprocessing as mp

    gen = torch.Generator().manual_seed(1)
    jobs = {"prefill": (torch.randint(100, 40000, (8, 64), generator=gen).tolist(), 1),
            "short": (torch.randint(100, 40000, (8, 32), generator=gen).tolist(), 1)}  # fmt: skip
    jobs["decode"] = (jobs["short"][0], 17)  # 16 decode steps more than "short"
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        model = str(build_even_model(Path(tmp)))
        conns, procs, info = {}, [], {}
        try:
            for name, (tp, threads) in TP2_CONFIGS.items():
                conns[name], child = ctx.Pipe()
                procs.append(ctx.Process(target=engine_process, args=(child, model, tp, threads)))
                procs[-1].start()
            info = {name: conn.recv() for name, conn in conns.items()}  # loaded
            last: dict[tuple[str, str], dict[str, Any]] = {}
            runs: dict[tuple[str, str], list[float]] = {}

            def job(name: str, kind: str) -> None:
                conns[name].send(jobs[kind])
                last[name, kind] = conns[name].recv()
                runs.setdefault((name, kind), []).append(last[name, kind]["seconds"])

            fns = {(n, k): lambda n=n, k=k: job(n, k) for n in TP2_CONFIGS for k in jobs}
            for fn in fns.values():  # warm-up
                fn()
            runs.clear()
            steal: dict[Any, list[float]] = {}
            interleaved_times(fns, rounds, steal)
        finally:
            for conn in conns.values():
                conn.send(None)
            for p in procs:
                p.join(60)
    return [tp2_row(name, info[name], runs, last, steal, rounds) for name in TP2_CONFIGS]


def tp2_row(name: str, info: dict, runs: dict, last: dict, steal: dict, rounds: int) -> dict:
    tp, threads = TP2_CONFIGS[name]
    med = {k: statistics.median(runs[name, k]) for k in ("prefill", "short", "decode")}
    decode = last[name, "decode"]
    row = {"bench": "tp2", "model": "random, SmolLM2-135M dims, 8 q / 4 KV heads of 72",
           "dtype": "float32", "config": name, "tp_size": tp, "threads_per_rank": threads,
           "rounds": rounds, "prefill_tokens": 8 * 64, "prefill_ms": 1000 * med["prefill"],
           "decode_rows": 8,
           "decode_ms_per_step": 1000 * (med["decode"] - med["short"]) / 16,
           "all_reduce_per_step": decode["all_reduce"] / decode["steps"],
           "gather_per_step": decode["gather"] / decode["steps"],
           **info, "rss_mb_per_rank": decode["rss_mb_per_rank"],
           "steal_share_median": statistics.median(steal[name, "decode"]),
           "seconds_per_round": {k: [round(t, 3) for t in runs[name, k]] for k in med},
           "same_ids_as_tp1": decode["ids"] == last["tp1 x 1 thread", "decode"]["ids"]}  # fmt: skip
    return row


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url + "/generate", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def shared_prefix_traffic(url: str) -> dict[str, Any]:
    prefixes = [f"System {k}: " + f"You answer questions about topic {k} briefly. " * 12
                for k in range(4)]  # fmt: skip
    bodies = [{"text": p + f"Question {j}: what is {j} plus {k}?", "sampling_params":
               {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}
              for k, p in enumerate(prefixes) for j in range(8)]  # fmt: skip
    post(url, bodies[0] | {"text": "warm up"})
    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda b: post(url, b), bodies))
    seconds = time.perf_counter() - t0
    valid = all(o["meta_info"]["completion_tokens"] == 8 and o["meta_info"]["finish_reason"]
                ["type"] == "length" for o in outs)  # fmt: skip
    cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
    prompt = sum(o["meta_info"]["prompt_tokens"] for o in outs)
    return {"requests": len(outs), "all_valid": valid, "seconds": seconds,
            "req_per_s": len(outs) / seconds, "cache_hit_share": cached / prompt}  # fmt: skip


def bench_dp(model: str, port: int) -> list[dict[str, Any]]:
    from stemma.runtime.server.data_parallel import wait_healthy

    rows = []
    for dp in (1, 2):
        cmd = [sys.executable, "-m", "stemma", "serve", "--model", model, "--port", str(port),
               "--log-level", "warning", "--dp-size", str(dp)]  # fmt: skip
        if dp == 1:
            cmd += ["--num-threads", str(os.cpu_count() or 1)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_healthy(f"http://127.0.0.1:{port}", proc)
            time.sleep(2 if dp > 1 else 0)  # the router's worker registration
            row = shared_prefix_traffic(f"http://127.0.0.1:{port}")
        finally:
            proc.terminate()
            proc.wait(120)
        rows.append(
            {
                "bench": "dp",
                "model": model,
                "dp_size": dp,
                "front": "sglang-router 0.3.2 cache_aware" if dp > 1 else "one server",
                "workload": "4 prefixes x 8 requests, 8 concurrent, 8 new tokens",
                **row,
            }
        )
    rows[1]["throughput_vs_one"] = rows[1]["req_per_s"] / rows[0]["req_per_s"]
    rows[1]["hit_share_vs_one"] = rows[1]["cache_hit_share"] - rows[0]["cache_hit_share"]
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=["tp", "tp2", "dp"], required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port", type=int, default=31500)
    ap.add_argument("--tp-sizes", default="1,3", help="SmolLM2-135M: 9 heads, 3 KV heads")
    args = ap.parse_args(argv)
    if args.part == "tp":
        sizes = [int(x) for x in args.tp_sizes.split(",")]
        rows = bench_tp(args.model, args.dtype, args.rounds, sizes)
    elif args.part == "tp2":
        rows = bench_tp2(args.rounds)
    else:
        rows = bench_dp(args.model, args.port)
    append_results("parallel_bench", rows)
    print_table(rows, [k for k in rows[-1] if not isinstance(rows[-1][k], list)])


if __name__ == "__main__":
    main()
