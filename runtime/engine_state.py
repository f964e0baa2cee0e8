"""Engine-side bookkeeping: where each request's outputs go, and the engine's metrics."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .response import StreamText
from .scheduler.req import Req

if TYPE_CHECKING:
    from .scheduler.batch import ScheduledBatch
    from .scheduler.scheduler import Scheduler

LATENCY_WINDOW = 10_000  # recent per-request latencies kept for percentiles


class EngineUnavailable(RuntimeError):
    """The engine cannot serve any more requests (a tensor-parallel rank was lost)."""


@dataclass(slots=True)
class Handle:
    index: int  # the item's position in its request (batch order)
    sink: Callable[[tuple[int, dict[str, Any], bool]], None]
    stream: StreamText | None


@dataclass(slots=True)
class EngineMetrics:
    num_requests: int = 0
    num_finished: dict[str, int] = field(
        default_factory=lambda: {"stop": 0, "length": 0, "abort": 0}
    )
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0
    num_steps: int = 0
    num_forward_tokens: int = 0
    ttft: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    tpot: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    e2e: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))

    def on_arrival(self, req: Req) -> None:
        self.num_requests += 1

    def on_step(self, batch: ScheduledBatch | None) -> None:
        if batch is not None:
            self.num_steps += 1
            self.num_forward_tokens += sum(batch.num_new)

    def on_first_token(self, req: Req) -> None:
        req.first_token_time = time.monotonic()
        self.ttft.append(req.first_token_time - req.arrival_time)

    def on_finish(self, req: Req) -> None:
        now = time.monotonic()
        self.num_finished[req.finish.kind] += 1
        self.prompt_tokens += len(req.input_ids)
        self.generation_tokens += len(req.output_ids)
        self.cached_tokens += req.cached_tokens
        self.e2e.append(now - req.arrival_time)
        if req.first_token_time is not None and len(req.output_ids) > 1:
            self.tpot.append((now - req.first_token_time) / (len(req.output_ids) - 1))

    def snapshot(self, scheduler: Scheduler) -> dict[str, Any]:
        tree, alloc = scheduler.tree, scheduler.alloc
        return {
            "num_requests": self.num_requests,
            "num_finished": dict(self.num_finished),
            "num_running": len(scheduler.running),
            "num_waiting": len(scheduler.waiting),
            "prompt_tokens": self.prompt_tokens,
            "generation_tokens": self.generation_tokens,
            "cached_tokens": self.cached_tokens,
            "num_steps": self.num_steps,
            "num_forward_tokens": self.num_forward_tokens,
            "num_retractions": scheduler.num_retractions,
            "kv_capacity": alloc.capacity,
            "kv_free": alloc.num_free,
            "kv_usage": 1 - alloc.num_free / alloc.capacity,
            "cache_evictable": tree.evictable_size if tree else 0,
            "cache_hit_tokens": tree.num_hit_tokens if tree else 0,
            "cache_queried_tokens": tree.num_queried_tokens if tree else 0,
            "ttft": list(self.ttft),
            "tpot": list(self.tpot),
            "e2e": list(self.e2e),
        }
