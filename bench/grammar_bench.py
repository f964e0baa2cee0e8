"""Constrained-decoding micro-benchmark on SmolLM2's vocabulary (49,152 tokens).

Measures compile latency cold / warm from memory / warm from disk for three constraints, mask
fill time per row (first visit of a state vs cached) and per batch of 32, and the fraction of
tokens jump-forward appends on a JSON tool call, decoded by a fake model (a fixed random score
per token id, greedy and sampled). Prints a table and appends one JSON line per metric to
bench/results/grammar.jsonl.

    python -m stemma.bench.grammar_bench [--repeats 3] [--no-record]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stemma.runtime.constrained.matcher import Matcher, fill_bitmask
from stemma.runtime.constrained.service import GrammarService
from stemma.runtime.constrained.spec import ConstraintSpec
from stemma.runtime.constrained.vocabulary import Vocabulary
from stemma.runtime.models.loader import resolve_checkpoint
from stemma.runtime.tokenizer import Tokenizer

from .common import append_results
from .tool_schemas import tool_call, weather_args

TOOL_CALL = tool_call(weather_args())
_FIELDS = {"id": "integer", "name": "string", "email": "string", "active": "boolean"}
NESTED_13 = {  # 13 leaf fields over three levels
    "type": "object",
    "properties": {
        "user": {
            "type": "object",
            "properties": {k: {"type": t} for k, t in _FIELDS.items()},
            "required": list(_FIELDS),
        },
        "address": {
            "type": "object",
            "properties": {k: {"type": "string"} for k in ("street", "city", "zip", "country")},
            "required": ["street", "city", "zip", "country"],
        },
        "order": {
            "type": "object",
            "properties": {
                "total": {"type": "number"},
                "currency": {"enum": ["EUR", "USD"]},
                "items": {"type": "array", "items": {"type": "string"}},
                "paid": {"type": "boolean"},
                "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            },
            "required": ["total", "currency", "items", "paid", "note"],
        },
    },
    "required": ["user", "address", "order"],
}
WORKLOADS = {
    "regex (yes|no)": ConstraintSpec(regex="(yes|no)"),
    "json tool call": ConstraintSpec.create(json_schema=TOOL_CALL),
    "json 13 nested fields": ConstraintSpec.create(json_schema=NESTED_13),
}


def _ready(handle: Any) -> Any:
    assert handle.wait(120) and handle.error is None, handle.error
    return handle


def warmed_service(vocab: Vocabulary, cache_dir: Path | None) -> GrammarService:
    """A service whose compile worker is already running (process start is not compile time)."""
    service = GrammarService(vocab, cache_dir=cache_dir, num_workers=1)
    _ready(service.submit("warm"))
    return service


def compile_latencies(vocab: Vocabulary, spec: ConstraintSpec, repeats: int) -> list[tuple]:
    cold, memory, disk = [], [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            with warmed_service(vocab, Path(tmp)) as service:
                start = time.perf_counter()
                _ready(service.submit(spec))
                cold.append(time.perf_counter() - start)
                start = time.perf_counter()
                assert service.submit(spec).ready()
                memory.append(time.perf_counter() - start)
            with warmed_service(vocab, Path(tmp)) as service:
                start = time.perf_counter()
                _ready(service.submit(spec))
                disk.append(time.perf_counter() - start)
                assert service.stats.compiles == 0  # everything came from disk
    return [
        ("compile_cold_ms", 1e3 * statistics.median(cold), "ms"),
        ("compile_warm_memory_us", 1e6 * statistics.median(memory), "us"),
        ("compile_warm_disk_ms", 1e3 * statistics.median(disk), "ms"),
    ]


def byte_distances(grammar: Any, start: int) -> dict[int, int]:
    """Fewest bytes from each state reachable from `start` to a final one (breadth-first,
    backwards, over single-byte tokens). The tests' fake model walks by it too."""
    single = grammar.vocab.single_byte_ids().values()
    reverse: dict[int, set[int]] = {}
    seen, stack = {start}, [start]
    while stack:
        state = stack.pop()
        for token_id in single:
            nxt = grammar.index.get_next_state(state, token_id)
            if nxt is not None:
                reverse.setdefault(nxt, set()).add(state)
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
    dist = {s: 0 for s in seen if grammar.is_final(s)}
    frontier, level = list(dist), 0
    while frontier:
        level += 1
        frontier = list({p for s in frontier for p in reverse.get(s, ()) if p not in dist})
        dist.update((p, level) for p in frontier)
    return dist


def fake_decode(
    matcher: Matcher, tokenizer: Tokenizer, scores: np.ndarray, *, jump: bool, seed: int | None
) -> tuple[list[int], int, list[int]]:
    """Fake-model decoding: (ids, ids appended by jump-forward, states where masks were filled).

    Greedy (seed None) or sampled over a fixed random score per token; after 48 tokens it walks
    to the nearest final state byte by byte so every run ends.
    """
    vocab = matcher.grammar.vocab
    rng = None if seed is None else np.random.default_rng(seed)
    row = np.empty((vocab.vocab_size + 31) // 32, dtype=np.int32)
    dist, ids, states, num_forced = byte_distances(matcher.grammar, matcher.state), [], [], 0
    eos = min(vocab.eos_token_ids)
    while not matcher.is_finished():
        if jump and (forced := matcher.jump_forward(tokenizer)):
            ids, num_forced = ids + forced, num_forced + len(forced)
            continue
        if len(ids) >= 48:
            token = eos if matcher.is_final() else _toward_final(matcher, dist)
        else:
            states.append(matcher.state)
            matcher.fill_mask(row)
            allowed = np.unpackbits(row.view(np.uint8), bitorder="little")[: vocab.vocab_size]
            logits = np.where(allowed.astype(bool), scores, -np.inf)
            probs = np.exp(logits - logits.max())
            token = int(
                np.argmax(logits) if rng is None else rng.choice(len(probs), p=probs / probs.sum())
            )
        matcher.accept_token(token)
        if token == eos:
            break
        ids.append(token)
    return ids, num_forced, states


def _toward_final(matcher: Matcher, dist: dict[int, int]) -> int:
    index, single = matcher.grammar.index, matcher.grammar.vocab.single_byte_ids().values()
    steps = ((index.get_next_state(matcher.state, t), t) for t in single)
    return min((dist.get(nxt, 1 << 30), t) for nxt, t in steps if nxt is not None)[1]


def mask_fill(
    service: GrammarService, tokenizer: Tokenizer, scores: np.ndarray, vocab_size: int
) -> list[tuple]:
    """Per-row fill time on a state's first visit and once cached, and per batch of 32."""
    handle = _ready(service.submit(WORKLOADS["json tool call"]))
    paths = [
        fake_decode(handle.matcher(), tokenizer, scores, jump=False, seed=s)[0] for s in range(4)
    ]
    row = np.empty((vocab_size + 31) // 32, dtype=np.int32)
    handle.matcher().grammar._rows.clear()  # decoding the paths above filled the row cache
    first_visit, cached = [], []
    for path in paths:
        matcher = handle.matcher()
        for token in path:
            was_cached = matcher.state in matcher.grammar._rows
            start = time.perf_counter_ns()
            matcher.fill_mask(row)
            (cached if was_cached else first_visit).append((time.perf_counter_ns() - start) / 1e3)
            matcher.accept_token(token)
    matchers: list[Matcher | None] = []
    for i in range(32):  # requests at different points of different outputs; every third free
        matcher = handle.matcher()
        for token in paths[i % 4][: 2 * i]:
            matcher.accept_token(token)
        matchers.append(None if i % 3 == 2 else matcher)
    out = torch.empty(32, (vocab_size + 31) // 32, dtype=torch.int32)
    batch = []
    for _ in range(200):
        start = time.perf_counter_ns()
        fill_bitmask(matchers, vocab_size, out=out)
        batch.append((time.perf_counter_ns() - start) / 1e3)
    return [
        ("mask_fill_row_first_visit_us", statistics.mean(first_visit), "us"),
        ("mask_fill_row_cached_us", statistics.median(cached), "us"),
        ("mask_fill_batch32_us", statistics.median(batch), "us"),
    ]


def jump_forward_share(
    service: GrammarService, tokenizer: Tokenizer, scores: np.ndarray
) -> list[tuple]:
    """Share of output tokens jump-forward appends on the tool call: fake-model outputs (greedy
    + 4 seeds, 48 random-scored tokens then the shortest completion) and three realistic calls."""
    handle = _ready(service.submit(WORKLOADS["json tool call"]))
    total = forced = 0
    start = time.perf_counter()
    for seed in (None, 0, 1, 2, 3):
        ids, num_forced, _ = fake_decode(handle.matcher(), tokenizer, scores, jump=True, seed=seed)
        total, forced = total + len(ids), forced + num_forced
    elapsed = time.perf_counter() - start
    counts = [follow_text(handle.matcher(), tokenizer, text) for text in REALISTIC_CALLS]
    realistic = sum(f for _, f in counts) / sum(n for n, _ in counts)
    return [
        ("jump_forward_token_share", forced / total, "fraction"),
        ("jump_forward_token_share_realistic_calls", realistic, "fraction"),
        ("tokens_per_output", total / 5, "tokens"),
        ("fake_decode_ms_per_output", 1e3 * elapsed / 5, "ms"),
    ]


REALISTIC_CALLS = [
    '{"name":"get_weather","arguments":{"city":"Paris","unit":"celsius","days":3}}',
    '{"name":"get_weather","arguments":{"city":"San Francisco","unit":"fahrenheit","days":7}}',
    '{"name":"get_weather","arguments":{"city":"Tokyo","unit":"celsius","days":1}}',
]


def follow_text(matcher: Matcher, tokenizer: Tokenizer, target: str) -> tuple[int, int]:
    """A model that writes `target` (longest allowed token each step), with jump-forward.

    Returns (output tokens, tokens jump-forward appended).
    """
    vocab, data = matcher.grammar.vocab, target.encode()
    by_bytes = {b: i for i, b in reversed(list(enumerate(vocab.token_bytes))) if b}
    pos = num_tokens = num_forced = 0
    while pos < len(data):
        if forced := matcher.jump_forward(tokenizer):
            num_forced += len(forced)
            token_ids = forced
        else:
            token_ids = [
                next(
                    t
                    for n in range(min(64, len(data) - pos), 0, -1)
                    if (t := by_bytes.get(data[pos : pos + n])) is not None and matcher.allows(t)
                )
            ]
            matcher.accept_token(token_ids[0])
        num_tokens += len(token_ids)
        pos += sum(len(vocab.token_bytes[t]) for t in token_ids)
    return num_tokens, num_forced


def record(workload: str, rows: list[tuple], command: str) -> None:
    # python's and torch's versions are in every line's hardware stamp (common.hardware)
    versions = {"outlines_core": importlib.metadata.version("outlines_core")}
    lines = [
        {
            "model": "smollm2-135m vocabulary (49,152 tokens)",
            "workload": workload,
            "metric": metric,
            "value": round(value, 4),
            "unit": unit,
        }
        for metric, value, unit in rows
    ]
    append_results("grammar", lines, command=command, versions=versions)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-record", action="store_true", help="do not append to results")
    args = parser.parse_args(argv)
    command = "python -m stemma.bench.grammar_bench " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    tokenizer = Tokenizer(resolve_checkpoint("smollm2-135m"))
    vocab = Vocabulary.from_tokenizer(tokenizer)
    scores = np.random.default_rng(0).standard_normal(vocab.vocab_size) * 2.0
    results: list[tuple[str, list[tuple]]] = []
    for name, spec in WORKLOADS.items():
        results.append((name, compile_latencies(vocab, spec, args.repeats)))
    with warmed_service(vocab, None) as service:
        results.append(
            ("json tool call, fake model", mask_fill(service, tokenizer, scores, vocab.vocab_size))
        )
        results.append(
            ("json tool call, fake model", jump_forward_share(service, tokenizer, scores))
        )
    print(f"{'workload':<28} {'metric':<30} {'value':>12}  unit")
    for workload, rows in results:
        for metric, value, unit in rows:
            print(f"{workload:<28} {metric:<30} {value:>12,.3f}  {unit}")
        if not args.no_record:
            record(workload, rows, command.strip())


if __name__ == "__main__":
    main()
