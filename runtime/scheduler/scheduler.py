"""Scheduler: continuous batching over the radix cache and the KV slot pool.

Each step is one forward: the running requests' decodes plus, when any are waiting or
mid-prefill, prefill chunks under a token budget (a MIXED batch), so a long prompt holds
decodes back by at most one chunk. Invariant after every step (check_memory()):
free + tree.evictable + tree.locked + private slots of running requests == capacity.
"""

from __future__ import annotations

from ...radix import RadixTree
from ..config import EngineConfig
from ..executor.model_runner import ModelRunner
from .batch import ScheduledBatch
from .output_processor import OutputProcessor
from .policy import RoundDedup, SchedulePolicy
from .req import FinishReason, Req

NEW_TOKEN_RATIO = 0.3  # share of each running request's remaining budget kept in reserve


class Scheduler:
    def __init__(self, cfg: EngineConfig, runner: ModelRunner, outputs: OutputProcessor):
        self.cfg = cfg
        self.runner = runner
        self.outputs = outputs
        self.alloc = runner.allocator
        self.rows = runner.req_to_token_pool
        self.page_size = cfg.page_size
        self.tree: RadixTree | None = None if cfg.disable_radix_cache else RadixTree(cfg.page_size)
        self.policy = SchedulePolicy(cfg.schedule_policy, self.tree)
        self.waiting: list[Req] = []
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
                self.release(req, finished=True)
            elif was_prefill:
                self.cache_unfinished(req)
        self.running = [r for r in self.running if r.finish is None]
        return rejected + batch.reqs

    def schedule(self) -> ScheduledBatch | None:
        decodes = [r for r in self.running if not r.is_prefilling]
        decodes = self.reserve_decode_slots(decodes)
        reqs, num_new = list(decodes), [r.num_pending for r in decodes]
        budget = self.cfg.max_prefill_tokens
        for req in [r for r in self.running if r.is_prefilling]:  # chunked prefills continue
            n = self.extend_len(req, budget)
            if n == 0 or not self.grow(req, n):
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
    def admit(self, budget: int) -> list[tuple[Req, int]]:
        admitted: list[tuple[Req, int]] = []
        dedup = RoundDedup(self.tree is not None)
        available = self.alloc.num_free + self.evictable()
        available -= int(NEW_TOKEN_RATIO * sum(self.remaining_budget(r) for r in self.running))
        for req in self.policy.order(self.waiting):
            if budget <= 0 or len(self.running) >= self.cfg.max_running_requests:
                break
            if not self.grammar_ready(req):
                continue
            prefix, node = self.match(req)
            if dedup.should_defer(req, len(prefix)):
                continue
            n = min(len(req.fill_ids) - len(prefix), self.cfg.chunked_prefill_size, budget)
            need = self.pages(n) + int(NEW_TOKEN_RATIO * self.remaining_budget(req))
            if need > available and (self.running or admitted):
                break  # keep arrival fairness: do not let later small requests jump ahead
            if self.rows.num_free_rows == 0:
                break
            if not self.start(req, prefix, node, n):
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
        req.grammar = handle.matcher()
        return True

    def match(self, req: Req) -> tuple[list[int], object]:
        if self.tree is None:
            return [], None
        ids = req.fill_ids[: req.max_prefix_len()]
        slots, node = self.tree.match_prefix(ids, req.namespace)
        return slots, node

    def start(self, req: Req, prefix: list[int], node: object, n: int) -> bool:
        """Give req a row, lock its cached prefix, and allocate its first chunk."""
        req.row = self.rows.alloc()
        req.slots, req.num_tree_slots, req.kv_len = list(prefix), len(prefix), len(prefix)
        if self.tree is not None:
            self.tree.lock(node)
            req.last_node = node
            claimed = self.tree.claim_partial_page(node, req.fill_ids[len(prefix) : -1])
            if claimed:  # the page is now private: its filled part is reused as-is
                base = claimed[0] - claimed[0] % self.page_size
                req.slots += list(range(base, base + self.page_size))
                req.kv_len += len(claimed)
                n = min(n, len(req.fill_ids) - req.kv_len)
        req.cached_tokens = max(req.cached_tokens, req.kv_len)
        self.rows.write(req.row, 0, req.slots[: req.kv_len])
        if n > 0 and self.grow(req, n):
            return True
        self.release(req, finished=False)
        return False

    def extend_len(self, req: Req, budget: int) -> int:
        return max(0, min(len(req.fill_ids) - req.kv_len, self.cfg.chunked_prefill_size, budget))

    # ---- memory ---------------------------------------------------------------------------
    def pages(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size) * self.page_size

    def evictable(self) -> int:
        return self.tree.evictable_size if self.tree is not None else 0

    @staticmethod
    def remaining_budget(req: Req) -> int:
        return max(req.params.max_new_tokens - len(req.output_ids), 0)

    def grow(self, req: Req, n: int) -> bool:
        """Make sure req owns slots for positions up to kv_len + n (whole pages)."""
        need = req.kv_len + n - len(req.slots)
        if need <= 0:
            return True
        slots = self.alloc.alloc(need)
        if slots is None and self.tree is not None:
            self.alloc.free(self.tree.evict(self.pages(need) - self.alloc.num_free))
            slots = self.alloc.alloc(need)
        if slots is None:
            return False
        req.slots += slots
        return True

    def reserve_decode_slots(self, decodes: list[Req]) -> list[Req]:
        """Each decode needs one more slot; evict, then retract the newest requests if short."""
        decodes = sorted(decodes, key=lambda r: r.arrival_time)
        while decodes:
            short = [r for r in decodes if not self.grow(r, r.num_pending)]
            if not short:
                return decodes
            victim = decodes.pop()  # the newest arrival loses the least work
            self.retract(victim)
        return decodes

    def retract(self, req: Req) -> None:
        """Back to waiting, nothing lost: its computed tokens go to the tree (evictable)."""
        self.release(req, finished=False)
        req.slots, req.num_tree_slots, req.kv_len, req.last_node = [], 0, 0, None
        self.running.remove(req)
        self.waiting.insert(0, req)
        self.num_retractions += 1

    def release(self, req: Req, finished: bool) -> None:
        """Hand req's computed tokens to the tree, free the rest, drop its lock and row."""
        n = req.kv_len
        keep = 0
        if self.tree is not None and req.last_node is not None:
            n_ins = n if finished else n - n % self.page_size
            res = self.tree.insert(req.fill_ids[:n_ins], req.slots[:n_ins], req.namespace)
            self.alloc.free(res.dup_slots)
            keep = self.pages(n_ins) if n_ins % self.page_size else n_ins
            self.tree.unlock(req.last_node)
            req.last_node = None
        self.alloc.free(self.private_tail(req, keep))
        if req.row is not None:
            self.rows.free(req.row)
            req.row = None
        req.num_tree_slots = 0

    def cache_unfinished(self, req: Req) -> None:
        """After a prefill chunk: the tree takes the computed whole pages (so requests that
        share them hit the cache now, not when req finishes); req keeps a lock on them."""
        if self.tree is None:
            return
        n = req.kv_len - req.kv_len % self.page_size
        if n <= req.num_tree_slots:
            return
        ids = req.fill_ids[:n]
        res = self.tree.insert(ids, req.slots[:n], req.namespace)
        self.alloc.free(res.dup_slots)
        slots, node = self.tree.match_prefix(ids, req.namespace, count_stats=False)
        self.tree.lock(node)
        self.tree.unlock(req.last_node)
        req.last_node, req.num_tree_slots = node, n
        if res.dup_slots:  # the tree kept other slots for some tokens: read those instead
            req.slots[:n] = slots
            self.rows.write(req.row, 0, slots)

    def private_tail(self, req: Req, keep: int) -> list[int]:
        """req's private slots from position `keep` on (the tree owns what lies before)."""
        start = max(keep, req.num_tree_slots)
        return req.slots[start:]

    def abort(self, rid: str, message: str) -> Req | None:
        for req in self.waiting:
            if req.rid == rid:
                self.waiting.remove(req)
                req.finish = FinishReason("abort", message=message)
                return req
        for req in self.running:
            if req.rid == rid:
                self.release(req, finished=False)
                self.running.remove(req)
                req.finish = FinishReason("abort", message=message)
                return req
        return None

    def flush_cache(self) -> None:
        if self.running or self.waiting:
            raise RuntimeError(
                f"flush_cache refused: {len(self.running)} running and "
                f"{len(self.waiting)} waiting requests"
            )
        if self.tree is not None:
            self.alloc.free(self.tree.reset())

    def check_memory(self) -> None:
        """The slot invariant of docs/ARCHITECTURE.md ("KV memory"); raises AssertionError."""
        tree = self.tree
        evictable = tree.evictable_size if tree else 0
        locked = tree.locked_size if tree else 0
        private = sum(r.num_private_slots for r in self.running)
        total = self.alloc.num_free + evictable + locked + private
        assert total == self.alloc.capacity, (
            f"free {self.alloc.num_free} + evictable {evictable} + locked {locked} + private "
            f"{private} = {total} != capacity {self.alloc.capacity}"
        )
        if tree is not None:
            tree.check_invariants()
