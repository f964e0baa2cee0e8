"""What bench/agents records of each gen, and the numbers it derives from a run's records.

A `Recorder` wraps any Backend: a single-prompt gen goes through `generate_stream` (or reads
the backend's own `ttft_s`), so TTFT and TPOT are measured the same way on every system; the
other requests (select's scoring, fork warm-ups) are kept for the cache hit rates only.
The offline optimum of the prompt cache: the share of a gen's prompt tokens that the
prompt + output of some earlier gen in the trace already held (an unbounded radix cache).
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class GenRecord:
    start: float
    ttft_s: float | None
    latency_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    prompt: str | list[int]  # a select's scoring requests carry token ids
    output: str


class Recorder:
    """A Backend that forwards to `inner` and records every gen it carries."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.records: list[GenRecord] = []
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:  # select_choice, tokenize, ... as `inner` has them
        return getattr(self.inner, name)

    def generate(self, req: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
        params = req.get("sampling_params") or {}
        is_gen = (
            isinstance(req.get("text"), str)
            and params.get("max_new_tokens") != 0
            and (params.get("n") or 1) == 1
        )
        if not is_gen:
            result = self.inner.generate(req)
            self._note_prompts(req, result)
            return result
        start = time.perf_counter()
        first: float | None = None
        last: dict[str, Any] = {}
        for chunk in self.inner.generate_stream({**req, "stream": True}):
            if first is None and chunk.get("text"):
                first = time.perf_counter()
            last = chunk
        latency = time.perf_counter() - start
        meta = last.get("meta_info") or {}
        ttft = meta.get("ttft_s") if "ttft_s" in meta else (first or time.perf_counter()) - start
        record = GenRecord(
            start=start,
            ttft_s=ttft,
            latency_s=latency,
            prompt_tokens=int(meta.get("prompt_tokens") or 0),
            cached_tokens=int(meta.get("cached_tokens") or 0),
            completion_tokens=int(meta.get("completion_tokens") or 0),
            prompt=req["text"],
            output=last.get("text", ""),
        )
        with self._lock:
            self.records.append(record)
        return {"text": record.output, "output_ids": [], "meta_info": meta}

    def _note_prompts(self, req: dict[str, Any], result: Any) -> None:
        """Keep a select's or warm-up's prompts (text or ids) for the hit rates."""
        prompts = req.get("text", req.get("input_ids"))
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        responses = result if isinstance(result, list) else [result]
        with self._lock:
            for prompt, response in zip(prompts or [], responses, strict=False):
                meta = response.get("meta_info") or {}
                self.records.append(
                    GenRecord(
                        start=time.perf_counter(),
                        ttft_s=None,
                        latency_s=0.0,
                        prompt_tokens=int(meta.get("prompt_tokens") or 0),
                        cached_tokens=int(meta.get("cached_tokens") or 0),
                        completion_tokens=0,
                        prompt=prompt,
                        output="",
                    )
                )


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(records: list[GenRecord], seconds: float, num_programs: int) -> dict[str, Any]:
    """programs/s, output tok/s, measured cache hit rate, TTFT and TPOT p50/p99 of one run."""
    gens = [r for r in records if r.latency_s > 0]
    ttfts = [r.ttft_s for r in gens if r.ttft_s is not None]
    tpots = [
        (r.latency_s - r.ttft_s) / (r.completion_tokens - 1)
        for r in records
        if r.ttft_s is not None and r.completion_tokens > 1
    ]
    prompt = sum(r.prompt_tokens for r in records)
    return {
        "programs_per_s": round(num_programs / seconds, 4),
        "output_tok_s": round(sum(r.completion_tokens for r in records) / seconds, 2),
        "num_gens": len(gens),
        "cache_hit_rate": round(sum(r.cached_tokens for r in records) / prompt, 4)
        if prompt
        else None,
        "ttft_p50_s": percentile(ttfts, 0.5),
        "ttft_p99_s": percentile(ttfts, 0.99),
        "tpot_p50_s": percentile(tpots, 0.5),
        "tpot_p99_s": percentile(tpots, 0.99),
    }


def optimum_hit_rate(records: list[GenRecord], tokenize: Any) -> float | None:
    """Share of prompt tokens held by an earlier gen's prompt + output (in start order)."""
    trie: dict[int, Any] = {}
    hit = total = 0
    for record in sorted(records, key=lambda r: r.start):
        is_text = isinstance(record.prompt, str)
        prompt_ids = tokenize(record.prompt) if is_text else list(record.prompt)
        node, depth = trie, 0
        for token in prompt_ids:
            if token not in node:
                break
            node, depth = node[token], depth + 1
        hit, total = hit + depth, total + len(prompt_ids)
        node = trie
        for token in tokenize(record.prompt + record.output) if is_text else prompt_ids:
            node = node.setdefault(token, {})
    return round(hit / total, 4) if total else None


def median_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None
