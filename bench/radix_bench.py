"""Radix tree micro-benchmark: match and insert throughput on a branching workload.

Workload: num_seqs sequences grown as a branching process; each continues a random earlier
sequence from a cut up to 200 tokens before its end (or restarts one of 16 shared 2k-token
prompts) and appends ~100 new tokens, so the tree ends up holding ~1M tokens. Prints a table
and appends one JSON line per metric to bench/results/radix.jsonl.

    python -m stemma.bench.radix_bench [--page-size 1 16] [--num-seqs 10000] [--no-record]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from collections.abc import Callable

from stemma.radix import RadixTree

from .common import append_results

VOCAB = 32_000
NUM_PROMPTS, PROMPT_LEN, QUERY_LEN = 16, 2048, 2048


def make_workload(num_seqs: int, new_per_seq: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(VOCAB) for _ in range(PROMPT_LEN)] for _ in range(NUM_PROMPTS)]
    seqs: list[list[int]] = []
    for j in range(num_seqs):
        if j < NUM_PROMPTS or rng.random() < 0.05:
            base = prompts[j % NUM_PROMPTS]
        else:
            parent = seqs[rng.randrange(len(seqs))]
            base = parent[: min(len(parent) - rng.randint(0, 200), 2600)]
        suffix = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 2 * new_per_seq - 1))]
        seqs.append(base + suffix)
    return seqs


class BumpAllocator:
    """Fresh whole pages from a counter; the benchmark never runs out."""

    def __init__(self, page_size: int) -> None:
        self.page_size, self.next_page = page_size, 1

    def alloc(self, num_tokens: int) -> list[int]:
        start = self.next_page * self.page_size
        self.next_page += -(-num_tokens // self.page_size)
        return list(range(start, start + num_tokens))


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - start) / 1e9


def build(tree: RadixTree, seqs: list[list[int]]) -> tuple[float, float]:
    """Admit and finish every sequence as a scheduler would; seconds in match and in insert."""
    alloc = BumpAllocator(tree.page_size)
    match_s = insert_s = 0.0
    for seq in seqs:
        t0 = time.perf_counter_ns()
        prefix, _ = tree.match_prefix(seq)
        t1 = time.perf_counter_ns()
        slots = prefix + alloc.alloc(len(seq) - len(prefix))
        t2 = time.perf_counter_ns()
        tree.insert(seq, slots)
        t3 = time.perf_counter_ns()
        match_s, insert_s = match_s + (t1 - t0) / 1e9, insert_s + (t3 - t2) / 1e9
    return match_s, insert_s


def query_latencies_us(tree: RadixTree, queries: list[list[int]]) -> list[float]:
    out = []
    for q in queries:
        start = time.perf_counter_ns()
        tree.match_prefix(q)
        out.append((time.perf_counter_ns() - start) / 1e3)
    return out


def path_nodes(tree: RadixTree, query: list[int]) -> int:
    node, num_nodes = tree.match_prefix(query, count_stats=False).last_node, 0
    while node.parent is not None:
        node, num_nodes = node.parent, num_nodes + 1
    return num_nodes


def evict_all(tree: RadixTree, chunk: int) -> None:
    while tree.evict(chunk):
        pass


def run(page_size: int, num_seqs: int, seed: int) -> tuple[dict[str, object], list[tuple]]:
    seqs = make_workload(num_seqs, new_per_seq=100, seed=seed)
    num_tokens = sum(len(s) for s in seqs)
    tree = RadixTree(page_size)
    gc.collect()
    _, insert_s = build(tree, seqs)
    workload: dict[str, object] = {
        "page_size": page_size,
        "num_seqs": num_seqs,
        "seed": seed,
        "cached_tokens": tree.total_size,
        "sequence_tokens": num_tokens,
    }
    rng = random.Random(seed + 1)
    long_seqs = [s for s in seqs if len(s) >= QUERY_LEN]
    hits = [rng.choice(long_seqs)[:QUERY_LEN] for _ in range(1000)]
    diverging = []
    for q in rng.sample(long_seqs, 1000):
        cut = rng.randrange(QUERY_LEN)
        diverging.append(q[:cut] + [VOCAB + 1] + q[cut + 1 : QUERY_LEN])
    gc.collect()
    match_s = timed(lambda: [tree.match_prefix(s) for s in seqs])
    hit_us = query_latencies_us(tree, hits)
    diverge_us = query_latencies_us(tree, diverging)
    tree.check_invariants()
    workload["path_nodes_2k_p50"] = statistics.median(path_nodes(tree, q) for q in hits)
    total = tree.total_size
    evict_s = timed(lambda: evict_all(tree, 4096))
    assert tree.total_size == 0
    rows = [
        ("insert_throughput", num_tokens / insert_s, "tokens/s"),
        ("match_throughput", num_tokens / match_s, "tokens/s"),
        ("match_2k_hit_p50", statistics.median(hit_us), "us"),
        ("match_2k_hit_p99", statistics.quantiles(hit_us, n=100)[98], "us"),
        ("match_2k_diverging_p50", statistics.median(diverge_us), "us"),
        ("evict_throughput", total / evict_s, "tokens/s"),
    ]
    return workload, rows


def record(workload: dict[str, object], rows: list[tuple], command: str) -> None:
    lines = [
        {"workload": workload, "metric": metric, "value": round(value, 3), "unit": unit}
        for metric, value, unit in rows
    ]
    append_results("radix", lines, command=command)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--page-size", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--num-seqs", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-record", action="store_true", help="do not append to results")
    args = parser.parse_args(argv)
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    command = f"python -m stemma.bench.radix_bench {argv_text}".strip()
    print(f"{'page_size':>9}  {'metric':<24} {'value':>14}  unit")
    for page_size in args.page_size:
        workload, rows = run(page_size, args.num_seqs, args.seed)
        for metric, value, unit in rows:
            print(f"{page_size:>9}  {metric:<24} {value:>14,.1f}  {unit}")
        print(f"{'':>9}  cached {workload['cached_tokens']:,} tokens from {args.num_seqs:,} seqs")
        if not args.no_record:
            record(workload, rows, command)


if __name__ == "__main__":
    main()
