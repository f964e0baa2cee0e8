"""Scheduler: continuous batching over the radix cache and the KV slot pool. It only decides.

Each step is one forward: the running requests' decodes plus, when any are waiting or
mid-prefill, prefill chunks under a token budget (a MIXED batch), so a long prompt holds
decodes back by at most one chunk. `schedule()` decides a step, `finish_step()` hands the
cache back after it; running the step is the engine core's (runtime/engine_core.py).
Invariant after every step (check_memory()):
free + tree.evictable + tree.locked + private slots of running requests == capacity.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

from ..config import EngineConfig
from ..executor.model_runner import ModelRunner
from .batch import ScheduledBatch
from .cache import CacheManager
from .policy import RoundDedup, SchedulePolicy
from .req import FinishReason, Req

NEW_TOKEN_RATIO = 0.3  # share of each running request's remaining budget kept in reserve

# A compiled constraint's matcher -> the one the request uses (early closing wraps it).
WrapMatcher = Callable[[Req, Any], Any]


class Scheduler:
    def __init__(
        self, cfg: EngineConfig, runner: ModelRunner, wrap_matcher: WrapMatcher | None = None
    ):
        """runner: only its memory pools are used (slot allocator, req_to_token rows)."""
        self.cfg = cfg
        self.cache = CacheManager(cfg, runner)
        self.alloc, self.rows, self.tree = self.cache.alloc, self.cache.rows, self.cache.tree
        self.policy = SchedulePolicy(cfg.schedule_policy, self.tree)
        self.wrap_matcher = wrap_matcher or (lambda req, matcher: matcher)
        self.waiting: list[Req] = []  # in arrival order (add and retract keep it so)
        self.running: list[Req] = []
        self.num_retractions = 0

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # ---- one step ---------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        """The next step: decodes, continuing prefill chunks, then admissions under the token
        budget; with the requests that finished without running (their batch.rejected). Its
        reqs are empty when nothing can run now (e.g. every waiting constraint compiles)."""
        rejected: list[Req] = []
        decodes = [r for r in self.running if not r.is_prefilling]
        decodes = self.reserve_decode_slots(decodes)
        reqs, num_new = list(decodes), [r.num_pending for r in decodes]
        budget = self.cfg.max_prefill_tokens
        for req in [r for r in self.running if r.is_prefilling]:  # chunked prefills continue
            n = self.extend_len(req, budget)
            if n == 0 or not self.cache.grow(req, n):
                continue
            reqs.append(req)
            num_new.append(n)
            budget -= n
        for req, n in self.admit(budget, rejected):
            reqs.append(req)
            num_new.append(n)
        is_prefill = [i >= len(decodes) for i in range(len(reqs))]
        return ScheduledBatch(reqs, num_new, is_prefill, rejected)

    def finish_step(self, batch: ScheduledBatch) -> None:
        """After the step's outputs: finished requests hand their KV to the cache, prefills
        that are still running insert what they computed."""
        for req, was_prefill in zip(batch.reqs, batch.is_prefill):
            if req.finish is not None:
                self.cache.release(req, finished=True)
            elif was_prefill:
                self.cache.cache_unfinished(req)
        self.running = [r for r in self.running if r.finish is None]

    # ---- admission ------------------------------------------------------------------------
    def add(self, req: Req) -> None:
        """Queue a new request, in arrival order (the newest goes last, in O(log n))."""
        bisect.insort(self.waiting, req, key=_arrival)

    def admit(self, budget: int, rejected: list[Req]) -> list[tuple[Req, int]]:
        """Waiting requests that start this step, with their chunk lengths; those that can
        never start go to `rejected`, finished."""
        admitted: list[tuple[Req, int]] = []
        dedup = RoundDedup(self.tree is not None)
        available = self.alloc.num_free + self.cache.evictable()
        available -= int(NEW_TOKEN_RATIO * sum(self.remaining_budget(r) for r in self.running))
        for req in self.policy.order(self.waiting):
            if budget <= 0 or len(self.running) >= self.cfg.max_running_requests:
                break
            if not self.grammar_ready(req, rejected):
                continue
            prefix, node = self.cache.match(req)
            if dedup.should_defer(req, len(prefix)):
                continue
            n = min(len(req.fill_ids) - len(prefix), self.cfg.chunked_prefill_size, budget)
            need = self.cache.pages(n) + int(NEW_TOKEN_RATIO * self.remaining_budget(req))
            if need > available and (self.running or admitted):
                break  # keep arrival fairness: do not let later small requests jump ahead
            if self.rows.num_free_rows == 0:
                break
            if not self.cache.start(req, prefix, node, n):
                if not (self.running or admitted):  # it cannot fit even in an empty pool
                    self.waiting.remove(req)
                    req.finish = FinishReason.abort(
                        f"the request needs more KV slots than the pool has ({self.alloc.capacity})"
                    )
                    rejected.append(req)
                break
            available -= need
            budget -= n
            dedup.admitted(req)
            admitted.append((req, n))
            self.waiting.remove(req)
            self.running.append(req)
        return admitted

    def grammar_ready(self, req: Req, rejected: list[Req]) -> bool:
        """False while its constraint compiles; a failed compile fails the request."""
        handle = req.grammar_handle
        if handle is None or req.grammar is not None:
            return True
        if not handle.ready():
            return False
        if handle.error is not None:
            self.waiting.remove(req)
            req.finish = FinishReason.abort(f"constraint: {handle.error}")
            rejected.append(req)
            return False
        req.grammar = self.wrap_matcher(req, handle.matcher())
        return True

    def extend_len(self, req: Req, budget: int) -> int:
        return max(0, min(len(req.fill_ids) - req.kv_len, self.cfg.chunked_prefill_size, budget))

    # ---- memory pressure ------------------------------------------------------------------
    @staticmethod
    def remaining_budget(req: Req) -> int:
        return max(req.tokens_left, 0)

    def reserve_decode_slots(self, decodes: list[Req]) -> list[Req]:
        """Each decode needs one more slot; evict, then retract the newest requests if short."""
        decodes = sorted(decodes, key=lambda r: r.arrival_time)
        while decodes:
            short = [r for r in decodes if not self.cache.grow(r, r.num_pending)]
            if not short:
                return decodes
            victim = decodes.pop()  # the newest arrival loses the least work
            self.retract(victim)
        return decodes

    def retract(self, req: Req) -> None:
        """Back to waiting, nothing lost: its computed tokens go to the tree (evictable)."""
        self.cache.release(req, finished=False)
        req.slots, req.num_tree_slots, req.kv_len, req.last_node = [], 0, 0, None
        self.running.remove(req)
        bisect.insort(self.waiting, req, key=_arrival)
        self.num_retractions += 1

    def abort(self, rid: str, message: str) -> Req | None:
        done = self.abort_many({rid: message})
        return done[0] if done else None

    def abort_many(self, messages: dict[str, str]) -> list[Req]:
        """Finish the requests named {rid: message} with an abort: one pass over each
        queue, so a disconnect aborting many requests costs O(queue), not O(queue^2)."""
        done = [r for r in self.waiting if r.rid in messages]
        if done:
            self.waiting[:] = [r for r in self.waiting if r.rid not in messages]
        for req in [r for r in self.running if r.rid in messages]:
            self.cache.release(req, finished=False)
            self.running.remove(req)
            done.append(req)
        for req in done:
            req.finish = FinishReason.abort(messages[req.rid])
        return done

    def flush_cache(self) -> None:
        if self.running or self.waiting:
            raise RuntimeError(
                f"flush_cache refused: {len(self.running)} running and "
                f"{len(self.waiting)} waiting requests"
            )
        self.cache.flush()

    def check_memory(self) -> None:
        """The slot invariant of docs/ARCHITECTURE.md ("KV memory"); raises AssertionError."""
        self.cache.check(self.running)

    def memory_state(self) -> dict[str, object]:
        """Slots by owner, rows, queue lengths, and the invariant's verdict (for debugging
        and the soak harness)."""
        state: dict[str, object] = self.cache.usage(self.running)
        state |= {"running": len(self.running), "waiting": len(self.waiting)}
        try:
            self.check_memory()
            state |= {"invariant_ok": True, "violation": None}
        except AssertionError as e:
            state |= {"invariant_ok": False, "violation": str(e)}
        return state


def _arrival(req: Req) -> float:
    return req.arrival_time
