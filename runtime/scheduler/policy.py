"""Which waiting requests go first: longest cached prefix first (cache-aware, the SGLang
paper's policy), falling back to arrival order when the queue is too long to rank cheaply.
A step looks at no more than MAX_RANKED_QUEUE of them (the queue is kept in arrival order),
so its cost does not grow with the queue.
Also defers a request whose uncached prefix another request admitted this round will compute.
"""

from __future__ import annotations

from ...radix import RadixTree
from .req import Req

MAX_RANKED_QUEUE = 256  # beyond this many waiting requests, ranking costs more than it saves
DEDUP_MIN_TOKENS = 32  # share at least this many uncached tokens before deferring


class SchedulePolicy:
    def __init__(self, policy: str, tree: RadixTree | None):
        self.policy = policy
        self.tree = tree

    def order(self, waiting: list[Req]) -> list[Req]:
        if self.policy == "fcfs" or self.tree is None or len(waiting) > MAX_RANKED_QUEUE:
            return waiting[:MAX_RANKED_QUEUE]  # the oldest: `waiting` is in arrival order
        hits = {
            r.rid: len(self.tree.match_prefix(r.fill_ids, r.namespace, count_stats=False).slots)
            for r in waiting
        }
        return sorted(waiting, key=lambda r: (-hits[r.rid], r.arrival_time))


class RoundDedup:
    """Within one scheduling round: defer a request whose uncached prefix overlaps what a
    request admitted earlier in the round is about to compute; next round it hits the cache."""

    def __init__(self, enabled: bool):
        self.tree = RadixTree() if enabled else None

    def should_defer(self, req: Req, num_cached: int) -> bool:
        if self.tree is None:
            return False
        shared = len(self.tree.match_prefix(req.fill_ids, req.namespace, count_stats=False).slots)
        return shared - num_cached >= DEDUP_MIN_TOKENS

    def admitted(self, req: Req) -> None:
        if self.tree is not None:
            ids = req.fill_ids
            self.tree.insert(ids, list(range(1, len(ids) + 1)), req.namespace)
