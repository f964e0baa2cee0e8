"""Engine-side bookkeeping: where each request's outputs go (a Handle, and for a caller's
events an EventBuffer that stays bounded however slowly the caller reads, read until every
request's final event by the functions below it), and the metrics."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .inbox import Event
from .response import StreamText
from .scheduler.req import FinishKind, Req

if TYPE_CHECKING:
    from .scheduler.batch import ScheduledBatch
    from .scheduler.scheduler import Scheduler

LATENCY_WINDOW = 10_000  # recent per-request latencies kept for percentiles


class EngineUnavailable(RuntimeError):
    """The engine cannot serve any more requests (a tensor-parallel rank was lost)."""


class QueueFull(RuntimeError):
    """More requests are waiting than max_queued_requests allows; the caller may retry."""


class QueueGate:
    """Refuses, on the caller's thread, a request that would queue past max_queued_requests:
    it counts what was submitted but not yet put in the scheduler's waiting queue."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.num_in_inbox = 0

    def check(self, num_waiting: int, num_new: int, limit: int) -> None:
        queued = self.num_in_inbox + num_waiting
        if queued + num_new > limit:
            raise QueueFull(
                f"{queued} requests are queued and this one adds {num_new}; the limit is "
                f"{limit} (--max-queued-requests); retry later"
            )

    def moved(self, num: int) -> None:
        """num requests entered the inbox (> 0) or left it for the waiting queue (< 0)."""
        with self._lock:
            self.num_in_inbox += num


class EventBuffer:
    """One call's events, from the engine thread (put) to its caller (get / get_nowait).

    Every final event is kept, in order. A progress event carries the request's cumulative
    text and ids, so it replaces that request's progress event the caller has not taken yet,
    and a final event drops it. However slowly the caller reads, the buffer holds at most two
    events per request. An async caller passes its loop: a put that makes the buffer non-empty
    wakes it (once per such change, not once per event).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._ready = threading.Condition(threading.Lock())
        self._cells: deque[list[Event | None]] = deque()  # [event]; [None] once superseded
        self._progress: dict[int, list[Event | None]] = {}  # item index -> its queued cell
        self._loop = loop
        self._async_ready = asyncio.Event()
        self.num_coalesced = 0

    def __len__(self) -> int:
        with self._ready:
            return sum(cell[0] is not None for cell in self._cells)

    def put(self, event: Event) -> None:
        idx, _, is_final = event
        with self._ready:
            was_empty = not self._cells
            queued = self._progress.pop(idx, None)
            if queued is not None:
                self.num_coalesced += 1
                if not is_final:
                    queued[0] = event
                    self._progress[idx] = queued
                    return
                queued[0] = None
            cell: list[Event | None] = [event]
            self._cells.append(cell)
            if not is_final:
                self._progress[idx] = cell
            self._ready.notify()
        if was_empty and self._loop is not None:  # RuntimeError once the loop is closed
            self._loop.call_soon_threadsafe(self._async_ready.set)

    def get_nowait(self) -> Event | None:
        with self._ready:
            return self._pop()

    def get(self) -> Event:
        """The next event, waiting for one."""
        with self._ready:
            while (event := self._pop()) is None:
                self._ready.wait()
            return event

    async def get_async(self) -> Event:
        """The next event, awaiting one (the buffer was made with the running loop)."""
        while (event := self.get_nowait()) is None:
            self._async_ready.clear()  # no await since the get: a put now sets it again
            if (event := self.get_nowait()) is not None:
                return event
            await self._async_ready.wait()
        return event

    def _pop(self) -> Event | None:
        while self._cells:
            cell = self._cells.popleft()
            if (event := cell[0]) is not None:
                if self._progress.get(event[0]) is cell:
                    del self._progress[event[0]]
                return event
        return None


def final_outputs(events: Iterator[Event], num: int, is_batch: bool) -> Any:
    """The final output of each of `num` requests, in item order (one alone unless a batch)."""
    results: list[Any] = [None] * num
    remaining = num
    for idx, out, is_final in events:
        if is_final:
            results[idx] = out
            remaining -= 1
            if remaining == 0:
                break
    return results if is_batch else results[0]


def stream_outputs(
    events: EventBuffer, reqs: list[Req], is_batch: bool, abort: Callable[[str, str], None]
) -> Iterator[dict[str, Any]]:
    """Each output as the caller reads it (a batch's tagged with its index); a reader that
    stops before the last final event frees the requests through abort(rid, reason)."""
    remaining = len(reqs)
    try:
        while remaining:
            idx, out, is_final = events.get()
            remaining -= is_final
            yield out | {"index": idx} if is_batch else out
    finally:
        if remaining:
            for req in reqs:
                abort(req.rid, "the client stopped reading the stream")


async def events_until_final(
    events: EventBuffer, reqs: list[Req], abort: Callable[[str, str], None]
) -> AsyncIterator[Event]:
    """The events of `reqs` up to the last final one; cancelled before it (e.g. the HTTP
    client went away), it frees the requests through abort(rid, reason)."""
    remaining = len(reqs)
    try:
        while remaining:
            ev = await events.get_async()
            remaining -= ev[2]
            yield ev
    finally:
        if remaining:
            for req in reqs:
                abort(req.rid, "the client disconnected")


@dataclass(slots=True)
class Handle:
    index: int  # the item's position in its request (batch order)
    sink: Callable[[Event], None]
    stream: StreamText | None


@dataclass(slots=True)
class EngineMetrics:
    num_requests: int = 0
    num_finished: dict[str, int] = field(
        default_factory=lambda: {kind.value: 0 for kind in FinishKind}
    )
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0
    num_steps: int = 0
    num_forward_tokens: int = 0
    spec_verify_ct: int = 0  # decode forwards of finished requests that had drafts
    spec_proposed: int = 0  # their draft tokens proposed
    spec_correct: int = 0  # and verified
    spec_tokens: int = 0  # their output tokens
    ttft: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    tpot: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    e2e: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))

    def on_arrival(self, req: Req) -> None:
        self.num_requests += 1

    def on_step(self, batch: ScheduledBatch | None) -> None:
        if batch is not None and batch.reqs:
            self.num_steps += 1
            self.num_forward_tokens += sum(batch.num_new)

    def on_first_token(self, req: Req) -> None:
        req.first_token_time = time.monotonic()
        self.ttft.append(req.first_token_time - req.arrival_time)

    def on_finish(self, req: Req) -> None:
        now = time.monotonic()
        self.num_finished[req.finish.kind.value] += 1
        self.prompt_tokens += len(req.input_ids)
        self.generation_tokens += len(req.output_ids)
        self.cached_tokens += req.cached_tokens
        if req.num_draft_tokens:
            self.spec_verify_ct += req.num_decode_steps
            self.spec_proposed += req.num_draft_tokens
            self.spec_correct += req.num_forced_tokens
            self.spec_tokens += len(req.output_ids)
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
            "spec_verify_ct": self.spec_verify_ct,
            "spec_num_proposed_drafts": self.spec_proposed,
            "spec_num_correct_drafts": self.spec_correct,
            "spec_accept_rate": self.spec_correct / max(self.spec_proposed, 1),
            "spec_accept_length": self.spec_tokens / max(self.spec_verify_ct, 1),
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
