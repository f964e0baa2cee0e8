"""Prometheus metrics for GET /metrics, in a registry of the server's own.

Counters and gauges are read from `Engine.get_metrics()` at scrape time. The engine keeps its
recent TTFT / TPOT / e2e latencies in bounded windows; each scrape feeds the histograms the
values appended since the previous scrape (those after the last value it saw), so a histogram
counts every request once while scrapes are more frequent than the window turns over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(slots=True)
class LatencyCursor:
    """Finds what an append-only window gained since the last look."""

    last: float | None = None

    def new_values(self, window: list[float]) -> list[float]:
        fresh = window
        if self.last is not None:
            for i in range(len(window) - 1, -1, -1):
                if window[i] == self.last:
                    fresh = window[i + 1 :]
                    break
        if window:
            self.last = window[-1]
        return fresh


class _EngineCollector:
    """Exposes the engine snapshot taken for the current scrape."""

    def __init__(self) -> None:
        self.snapshot: dict[str, Any] = {}

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        if not s:
            return
        for name, key, doc in (
            ("stemma_prompt_tokens", "prompt_tokens", "Prompt tokens of finished requests"),
            ("stemma_generation_tokens", "generation_tokens", "Generated tokens"),
            ("stemma_cached_tokens", "cached_tokens", "Prompt tokens served from the cache"),
            ("stemma_retractions", "num_retractions", "Requests retracted under KV pressure"),
            ("stemma_spec_verify_calls", "spec_verify_ct", "Decode forwards verifying drafts"),
            ("stemma_spec_proposed_drafts", "spec_num_proposed_drafts", "Draft tokens proposed"),
            ("stemma_spec_correct_drafts", "spec_num_correct_drafts", "Draft tokens verified"),
        ):
            yield CounterMetricFamily(name, doc, value=s[key])
        finished = CounterMetricFamily(
            "stemma_requests_finished", "Finished engine requests", labels=["reason"]
        )
        for reason, count in s["num_finished"].items():
            finished.add_metric([reason], count)
        yield finished
        queried = s["cache_queried_tokens"]
        for name, value, doc in (
            ("stemma_num_running_requests", s["num_running"], "Requests running"),
            ("stemma_num_waiting_requests", s["num_waiting"], "Requests waiting"),
            ("stemma_kv_usage", s["kv_usage"], "Fraction of KV slots not free"),
            (
                "stemma_spec_accept_rate",
                s["spec_accept_rate"],
                "Draft tokens verified / proposed (finished requests with drafts)",
            ),
            (
                "stemma_spec_accept_length",
                s["spec_accept_length"],
                "Output tokens per decode forward (finished requests with drafts)",
            ),
            ("stemma_kv_capacity_tokens", s["kv_capacity"], "KV slots in the pool"),
            ("stemma_cache_evictable_tokens", s["cache_evictable"], "Cached, unlocked slots"),
            (
                "stemma_cache_hit_rate",
                s["cache_hit_tokens"] / queried if queried else 0.0,
                "Prompt tokens found in the radix cache / prompt tokens looked up",
            ),
        ):
            yield GaugeMetricFamily(name, doc, value=value)


class ServerMetrics:
    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "stemma_http_requests",
            "HTTP requests by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.histograms = {
            "ttft": Histogram(
                "stemma_time_to_first_token_seconds",
                "Time to first token",
                buckets=LATENCY_BUCKETS,
                registry=self.registry,
            ),
            "tpot": Histogram(
                "stemma_time_per_output_token_seconds",
                "Time per output token after the first",
                buckets=TOKEN_LATENCY_BUCKETS,
                registry=self.registry,
            ),
            "e2e": Histogram(
                "stemma_e2e_request_latency_seconds",
                "Arrival to finish",
                buckets=LATENCY_BUCKETS,
                registry=self.registry,
            ),
        }
        self.cursors = {name: LatencyCursor() for name in self.histograms}
        self.collector = _EngineCollector()
        self.registry.register(self.collector)
        self.lock = asyncio.Lock()

    def count_request(self, route: str, status: int) -> None:
        self.requests.labels(route, str(status)).inc()

    async def render(self) -> bytes:
        """Take an engine snapshot (off the event loop) and render the text format."""
        async with self.lock:
            snapshot = await asyncio.to_thread(self.engine.get_metrics)
            for name, histogram in self.histograms.items():
                for value in self.cursors[name].new_values(snapshot[name]):
                    histogram.observe(value)
            self.collector.snapshot = snapshot
            return generate_latest(self.registry)
