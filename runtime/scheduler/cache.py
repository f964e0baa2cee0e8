"""CacheManager: the scheduler's protocol with KV memory, the radix tree, the slot allocator
and the request-to-token rows. A request's slots are [tree prefix | private tail]: `start`
locks its cached prefix, `grow` allocates private pages (evicting unlocked prefixes when
short), `cache_unfinished` and `release` hand computed tokens to the tree. Invariant after
every step (`check`): free + evictable + locked + private == capacity.
"""

from __future__ import annotations

from ...radix import RadixNode, RadixTree
from ..config import EngineConfig
from ..executor.model_runner import ModelRunner
from .req import Req


class CacheManager:
    def __init__(self, cfg: EngineConfig, runner: ModelRunner):
        self.alloc = runner.allocator
        self.rows = runner.req_to_token_pool
        self.page_size = cfg.page_size
        self.tree: RadixTree | None = None if cfg.disable_radix_cache else RadixTree(cfg.page_size)

    def match(self, req: Req) -> tuple[list[int], RadixNode | None]:
        if self.tree is None:
            return [], None
        ids = req.fill_ids[: req.max_prefix_len()]
        slots, node = self.tree.match_prefix(ids, req.namespace)
        return slots, node

    def start(self, req: Req, prefix: list[int], node: RadixNode | None, n: int) -> bool:
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

    def pages(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size) * self.page_size

    def evictable(self) -> int:
        return self.tree.evictable_size if self.tree is not None else 0

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

    def flush(self) -> None:
        """Empty the tree (the caller makes sure no request holds a lock)."""
        if self.tree is not None:
            self.alloc.free(self.tree.reset())

    def usage(self, running: list[Req]) -> dict[str, int]:
        tree = self.tree
        return {
            "capacity": self.alloc.capacity,
            "free": self.alloc.num_free,
            "evictable": tree.evictable_size if tree else 0,
            "locked": tree.locked_size if tree else 0,
            "private": sum(r.num_private_slots for r in running),
            "rows_total": self.rows.req_to_token.shape[0],
            "rows_free": self.rows.num_free_rows,
        }

    def check(self, running: list[Req]) -> None:
        """The slot invariant of docs/ARCHITECTURE.md ("KV memory"); raises AssertionError."""
        tree = self.tree
        evictable = tree.evictable_size if tree else 0
        locked = tree.locked_size if tree else 0
        private = sum(r.num_private_slots for r in running)
        total = self.alloc.num_free + evictable + locked + private
        assert total == self.alloc.capacity, (
            f"free {self.alloc.num_free} + evictable {evictable} + locked {locked} + private "
            f"{private} = {total} != capacity {self.alloc.capacity}"
        )
        if tree is not None:
            tree.check_invariants()
