"""Random operation sequences against a brute-force model of the cache, as a scheduler drives it.

The model is a dict page-key -> slots, where a page key is (namespace, tokens before the page,
the page's tokens); a partial last page is a key with fewer than page_size tokens. A fake
allocator hands out whole pages and rejects double frees, and every step checks
free + evictable + locked + private == capacity.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from dataclasses import dataclass

import pytest
from stemma.radix import RadixNode, RadixTree

PageKey = tuple[Hashable, tuple[int, ...], tuple[int, ...]]


class PageAllocator:
    def __init__(self, num_pages: int, page_size: int) -> None:
        self.page_size = page_size
        self.capacity = (num_pages - 1) * page_size
        self.free_pages = set(range(1, num_pages))  # page 0 holds the padding slot

    @property
    def num_free(self) -> int:
        return len(self.free_pages) * self.page_size

    def alloc(self, num_tokens: int) -> list[int] | None:
        num_pages = -(-num_tokens // self.page_size)
        if num_pages > len(self.free_pages):
            return None
        pages = sorted(self.free_pages)[:num_pages]
        self.free_pages.difference_update(pages)
        return [p * self.page_size + j for p in pages for j in range(self.page_size)]

    def free(self, slots: list[int]) -> None:
        ps = self.page_size
        assert len(slots) % ps == 0
        for j in range(0, len(slots), ps):
            page = slots[j] // ps
            assert slots[j : j + ps] == list(range(page * ps, page * ps + ps))
            assert page not in self.free_pages, f"page {page} freed twice"
            self.free_pages.add(page)


class Model:
    """Every cached page, keyed by what precedes it; the tree must hold exactly these."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.pages: dict[PageKey, list[int]] = {}

    def match(self, ns: Hashable, q: list[int]) -> list[int]:
        slots: list[int] = []
        j, ps = 0, self.page_size
        while j + ps <= len(q) and (ns, tuple(q[:j]), tuple(q[j : j + ps])) in self.pages:
            slots += self.pages[(ns, tuple(q[:j]), tuple(q[j : j + ps]))]
            j += ps
        return slots

    def partial(self, ns: Hashable, q: list[int], j: int) -> list[PageKey]:
        """Partial-page keys right after position j that q covers, longest first."""
        rs = range(min(self.page_size - 1, len(q) - j), 0, -1)
        keys = [(ns, tuple(q[:j]), tuple(q[j : j + r])) for r in rs]
        return [key for key in keys if key in self.pages]

    def insert(self, ns: Hashable, q: list[int], s: list[int]) -> tuple[int, list[int]]:
        ps, j, dups = self.page_size, 0, []
        while j < len(q):
            prefix, page = tuple(q[:j]), tuple(q[j : j + ps])
            cached = self.pages.get((ns, prefix, page))
            if cached is None and len(page) < ps:
                cover = [
                    v
                    for (n, p, t), v in self.pages.items()
                    if (n, p) == (ns, prefix) and t[: len(page)] == page
                ]
                cached = cover[0][: len(page)] if cover else None
            if cached is None:
                break
            given = s[j : j + len(page)]
            if given != cached[: len(page)]:
                dups += list(range(given[0], given[0] + ps))
            j += len(page)
        for k in range(j, len(q), ps):
            self.pages[(ns, tuple(q[:k]), tuple(q[k : k + ps]))] = s[k : k + ps]
        return j, dups

    def from_tree(self, tree: RadixTree) -> dict[PageKey, list[int]]:
        pages: dict[PageKey, list[int]] = {}
        ps = self.page_size
        for ns, tokens, slots in tree.sequences():
            for k in range(0, len(tokens), ps):
                pages[(ns, tuple(tokens[:k]), tuple(tokens[k : k + ps]))] = slots[k : k + ps]
        return pages


@dataclass
class Req:
    ns: Hashable
    tokens: list[int]
    slots: list[int]
    node: RadixNode
    locked_pages: set[int]
    own_pages: set[int]


class Driver:
    """Plays scheduler: admits, finishes, chunks, probes, evicts, pins; checks after each step."""

    def __init__(self, seed: int, page_size: int, namespaces: list[Hashable]) -> None:
        self.rng = random.Random(seed)
        self.ps = page_size
        self.namespaces = namespaces
        self.tree = RadixTree(page_size)
        self.model = Model(page_size)
        self.alloc = PageAllocator(num_pages=48 if page_size == 1 else 24, page_size=page_size)
        self.reqs: list[Req] = []
        self.pins: list[tuple[Hashable, list[int], set[int]]] = []
        self.history: list[list[int]] = []
        self.last_finished: list[int] | None = None
        self.alphabet = 3 if page_size == 1 else 2

    def tokens(self) -> list[int]:
        rng = self.rng
        if self.last_finished and rng.random() < 0.2:
            base = self.last_finished  # the next turn of a conversation that just finished
        elif self.history and rng.random() < 0.7:
            base = rng.choice(self.history)  # whole (a next turn) or cut (a sibling branch)
            base = base if rng.random() < 0.3 else base[: rng.randint(0, len(base))]
        else:
            base = []
        extra = [rng.randrange(self.alphabet) for _ in range(rng.randint(0 if base else 1, 9))]
        seq = (base + extra)[:28] or [0]
        self.history = (self.history + [seq])[-40:]
        return seq

    def locked_pages(self) -> set[int]:
        pages = {p for req in self.reqs for p in req.locked_pages}
        return pages.union(*(pinned for _, _, pinned in self.pins))

    def pages_of(self, slots: list[int]) -> set[int]:
        return {s // self.ps for s in slots}

    def alloc_or_evict(self, num_tokens: int) -> list[int] | None:
        slots = self.alloc.alloc(num_tokens)
        if slots is None:
            self.evict(num_tokens)
            slots = self.alloc.alloc(num_tokens)
        return slots

    def admit(self) -> None:
        ns, q = self.rng.choice(self.namespaces), self.tokens()
        probe = q if self.rng.random() < 0.85 else []  # some requests skip the cache
        slots, node = self.tree.match_prefix(probe, ns)
        assert slots == self.model.match(ns, probe)
        assert node.is_attached
        self.tree.lock(node)
        req = Req(ns, q, list(slots), node, self.pages_of(slots), set())
        self.reqs.append(req)  # before any eviction, so its path counts as locked
        if self.ps > 1 and self.rng.random() < 0.6:
            self.claim(req)
        num_tail = -len(req.slots) % self.ps  # unwritten slots left in a claimed page
        if num_tail:
            last = req.slots[-1]
            req.slots += list(range(last + 1, last + 1 + num_tail))[: len(q) - len(req.slots)]
        if len(q) > len(req.slots):
            fresh = self.alloc_or_evict(len(q) - len(req.slots))
            if fresh is None:  # no room even after eviction: abort the admission
                self.reqs.remove(req)
                self.tree.unlock(node)
                self.alloc.free(sorted({s for p in req.own_pages for s in self.page(p)}))
                return
            req.own_pages |= self.pages_of(fresh)
            req.slots += fresh[: len(q) - len(req.slots)]

    def page(self, page: int) -> range:
        return range(page * self.ps, page * self.ps + self.ps)

    def claim(self, req: Req) -> None:
        locked = self.locked_pages()
        keys = self.model.partial(req.ns, req.tokens, len(req.slots))
        keys = [k for k in keys if self.model.pages[k][0] // self.ps not in locked]
        claimed = self.tree.claim_partial_page(req.node, req.tokens[len(req.slots) :])
        assert claimed == (self.model.pages.pop(keys[0]) if keys else [])
        req.slots += claimed
        req.own_pages |= self.pages_of(claimed)

    def cache(self, req: Req, end: int) -> None:
        """Insert req's first `end` tokens and free the duplicates, as the scheduler does."""
        q, s = req.tokens[:end], req.slots[:end]
        expected = self.model.insert(req.ns, q, s)
        result = self.tree.insert(q, s, req.ns)
        assert (result.num_cached, result.dup_slots) == expected
        self.alloc.free(result.dup_slots)
        req.own_pages -= self.pages_of(s)

    def finish(self) -> None:
        req = self.reqs.pop(self.rng.randrange(len(self.reqs)))
        self.cache(req, len(req.tokens))
        self.tree.unlock(req.node)
        assert not req.own_pages
        self.last_finished = req.tokens

    def chunk(self) -> None:
        """A running request caches its whole pages, moves its lock and takes the tree's slots."""
        req = self.rng.choice(self.reqs)
        end = len(req.tokens) - len(req.tokens) % self.ps
        self.cache(req, end)
        slots, node = self.tree.match_prefix(req.tokens[:end], req.ns, count_stats=False)
        assert len(slots) == end
        self.tree.lock(node)
        self.tree.unlock(req.node)
        req.node, req.slots = node, slots + req.slots[end:]
        req.locked_pages = self.pages_of(slots)

    def evict(self, num_slots: int) -> None:
        locked, before = self.locked_pages(), self.tree.evictable_size
        freed = self.tree.evict(num_slots)
        assert len(freed) >= num_slots or self.tree.evictable_size == 0
        assert before - self.tree.evictable_size == len(freed)
        owner = {v[0] // self.ps: k for k, v in self.model.pages.items()}
        for j in range(0, len(freed), self.ps):
            page = freed[j] // self.ps
            assert page not in locked
            assert freed[j : j + self.ps] == list(self.page(page))
            del self.model.pages[owner.pop(page)]  # KeyError: not cached, or freed twice
        self.alloc.free(freed)

    def pin(self) -> None:
        ns, q = self.rng.choice(self.namespaces), self.tokens()
        slots = self.model.match(ns, q)
        keys = self.model.partial(ns, q, len(slots))
        slots += self.model.pages[keys[0]] if keys else []
        assert self.tree.pin(q, ns) == len(slots)
        self.pins.append((ns, q, self.pages_of(slots)))

    def unpin(self) -> None:
        ns, q, _ = self.rng.choice(self.pins)
        self.tree.unpin(q, ns)  # undoes the latest pin of the same tokens
        latest = max(j for j, (n, t, _) in enumerate(self.pins) if (n, t) == (ns, q))
        del self.pins[latest]

    def probe(self) -> None:
        ns, q = self.rng.choice(self.namespaces), self.tokens()
        slots, _ = self.tree.match_prefix(q, ns, count_stats=self.rng.random() < 0.5)
        assert slots == self.model.match(ns, q)

    def reset(self) -> None:
        for ns, q, _ in self.pins:
            self.tree.unpin(q, ns)
        self.pins.clear()
        freed = self.tree.reset()
        held = [s for v in self.model.pages.values() for s in self.page(v[0] // self.ps)]
        assert sorted(freed) == sorted(held)
        self.alloc.free(sorted(freed))
        self.model.pages.clear()

    def step(self) -> None:
        r = self.rng.random()
        if r < 0.30 or not self.reqs:
            self.admit()
        elif r < 0.57:
            self.finish()
        elif r < 0.65:
            self.chunk()
        elif r < 0.80:
            self.probe()
        elif r < 0.90:
            self.evict(self.rng.randint(1, 3 * self.ps))
        elif r < 0.95:
            self.pin()
        elif self.pins:
            self.unpin()
        if not self.reqs and self.rng.random() < 0.01:
            self.reset()

    def check(self) -> None:
        tree, ps = self.tree, self.ps
        tree.check_invariants()
        assert self.model.from_tree(tree) == self.model.pages
        locked = self.locked_pages()
        assert tree.locked_size == len(locked) * ps
        assert tree.evictable_size == (len(self.model.pages) - len(locked)) * ps
        assert tree.total_size == sum(len(k[2]) for k in self.model.pages)
        assert tree.num_hit_tokens <= tree.num_queried_tokens
        private = sum(len(req.own_pages) for req in self.reqs) * ps
        assert self.alloc.num_free + tree.evictable_size + tree.locked_size + private == (
            self.alloc.capacity
        )


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("namespaces", [[None], [None, "lora-a", 7]], ids=["one-ns", "three-ns"])
def test_random_ops_match_model(seed: int, page_size: int, namespaces: list[Hashable]) -> None:
    driver = Driver(seed, page_size, namespaces)
    for _ in range(3000):
        driver.step()
        driver.check()
    while driver.reqs:
        driver.finish()
        driver.check()
    for ns, q, _ in driver.pins:
        driver.tree.unpin(q, ns)
    driver.pins.clear()
    driver.evict(10**9)
    driver.check()
    assert driver.tree.total_size == 0
    assert driver.alloc.num_free == driver.alloc.capacity
