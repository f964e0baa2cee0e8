"""Scheduler: continuous batching over the radix cache and the KV slot pool.

Each step is one forward: the running requests' decodes plus, when any are waiting or
mid-prefill, prefill chunks under a token budget (a MIXED batch), so a long prompt holds
decodes back by at most one chunk. Invariant after every step (check_memory()):
free + tree.evictable + tree.locked + private slots of running requests == capacity.
"""

from __future__ import annotations

import bisect

from ..config import EngineConfig
from ..executor.model_runner import ModelRunner
from .batch import ScheduledBatch
from .cache import CacheManager
from .output_processor import OutputProcessor
from .policy import RoundDedup, SchedulePolicy
from .req import FinishReason, Req

NEW_TOKEN_RATIO = 0.3  # share of each running request's remaining budget kept in reserve


class Scheduler:
    def __init__(self, cfg: EngineConfig, runner: ModelRunner, outputs: OutputProcessor):
        self.cfg = cfg
        self.runner = runner
        self.outputs = outputs
        self.cache = CacheManager(cfg, runner)
        self.alloc, self.rows, self.tree = self.cache.alloc, self.cache.rows, self.cache.tree
        self.policy = SchedulePolicy(cfg.schedule_policy, self.tree)
        self.waiting: list[Req] = []  # in arrival order (add and retract keep it so)
        self.running: list[Req] = []
        self.last_batch: ScheduledBatch | None = None
        self.rejected: list[Req] = []  # finished without running; the engine reports them
        self.num_retractions = 0

    # ---- the loop body -------------------------------------------------------------------
    def step(self) -> list[Req]:
        """Schedule and run one forward; returns the requests that advanced or finished."""
        batch = self.schedule()
        self.last_batch = batch
        rejected, self.rejected = self.rejected, []
        if batch is None:
            return rejected
        fb, plans = self.outputs.build_forward(self.runner, batch)
        logits = self.runner.forward(fb)
        self.outputs.process(batch, plans, logits)
        for req, was_prefill in zip(batch.reqs, batch.is_prefill):
            if req.finish is not None:
                self.cache.release(req, finished=True)
            elif was_prefill:
                self.cache.cache_unfinished(req)
        self.running = [r for r in self.running if r.finish is None]
        return rejected + batch.reqs

    def schedule(self) -> ScheduledBatch | None:
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
        for req, n in self.admit(budget):
            reqs.append(req)
            num_new.append(n)
        is_prefill = [i >= len(decodes) for i in range(len(reqs))]
        return ScheduledBatch(reqs, num_new, is_prefill) if reqs else None

    # ---- admission ------------------------------------------------------------------------
    def add(self, req: Req) -> None:
        """Queue a new request, in arrival order (the newest goes last, in O(log n))."""
        bisect.insort(self.waiting, req, key=_arrival)

    def admit(self, budget: int) -> list[tuple[Req, int]]:
        admitted: list[tuple[Req, int]] = []
        dedup = RoundDedup(self.tree is not None)
        available = self.alloc.num_free + self.cache.evictable()
        available -= int(NEW_TOKEN_RATIO * sum(self.remaining_budget(r) for r in self.running))
        for req in self.policy.order(self.waiting):
            if budget <= 0 or len(self.running) >= self.cfg.max_running_requests:
                break
            if not self.grammar_ready(req):
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
                    req.finish = FinishReason(
                        "abort",
                        message="the request needs more KV "
                        f"slots than the pool has ({self.alloc.capacity})",
                    )
                    self.rejected.append(req)
                break
            available -= need
            budget -= n
            dedup.admitted(req)
            admitted.append((req, n))
            self.waiting.remove(req)
            self.running.append(req)
        return admitted

    def grammar_ready(self, req: Req) -> bool:
        """False while its constraint compiles; a failed compile fails the request."""
        handle = req.grammar_handle
        if handle is None or req.grammar is not None:
            return True
        if not handle.ready():
            return False
        if handle.error is not None:
            self.waiting.remove(req)
            req.finish = FinishReason("abort", message=f"constraint: {handle.error}")
            self.rejected.append(req)
            return False
        req.grammar = self.outputs.matcher_for(req, handle.matcher())
        return True

    def extend_len(self, req: Req, budget: int) -> int:
        return max(0, min(len(req.fill_ids) - req.kv_len, self.cfg.chunked_prefill_size, budget))

    # ---- memory pressure ------------------------------------------------------------------
    @staticmethod
    def remaining_budget(req: Req) -> int:
        return max(req.params.max_new_tokens - len(req.output_ids), 0)

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
            req.finish = FinishReason("abort", message=messages[req.rid])
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
