"""RadixTree: token-id sequences -> KV slots, so every shared prefix is held once.

Invariants (check_invariants() verifies them): children are keyed by their edge's first token
(first page when paged); only roots have empty edges; only a leaf's edge may end in a partial
page; locking a node adds one to its lock_ref and every ancestor's; last_access never decreases
toward the root; evictable_size + locked_size are exactly the slots held, in whole pages.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence

from .core import TreeCore
from .invariants import check_tree
from .node import InsertResult, MatchResult, RadixNode
from .pages import check_page_structure, common_prefix_len, dup_slots, whole_pages


class RadixTree(TreeCore):
    """The prefix cache: one tree per namespace (e.g. a LoRA id or tenant salt), one LRU.

    Scheduler protocol (as SGLang's RadixCache):
      admit:   slots, node = tree.match_prefix(ids, ns); tree.lock(node)
      finish:  res = tree.insert(ids, req_slots, ns); allocator.free(res.dup_slots);
               tree.unlock(node). Every other slot in req_slots now belongs to the tree.
      chunk:   insert only whole pages of a request that keeps running (it still writes its
               last page), free res.dup_slots, re-match, lock the new node, unlock the old one.
      memory:  allocator.free(tree.evict(num_slots))

    Accounting: evictable_size and locked_size count slots held (whole pages when paged); a node
    is locked while its lock_ref > 0, and pinned prefixes count as locked (a pin is a lock the
    tree holds itself), so free + evictable_size + locked_size + private == usable slots.
    total_size counts cached tokens.

    Paged (page_size > 1): matches, splits and non-leaf edges are page-aligned. insert() keeps a
    sequence's partial last page as a leaf, where SGLang frees it. match_prefix() never returns
    it, because the page's unwritten tail can have only one writer; a request that extends it
    takes it with claim_partial_page(), which moves the page out of the tree into the request's
    ownership, so the request writes its next tokens into the rest of that same page.
    """

    def match_prefix(
        self, tokens: Sequence[int], namespace: Hashable = None, *, count_stats: bool = True
    ) -> MatchResult:
        """Longest cached prefix of whole pages; splits an edge so last_node ends exactly there.

        Refreshes the path's LRU time. count_stats=False leaves the hit counters alone (for a
        policy that only ranks waiting requests).
        """
        q = list(tokens)
        node, slots = self._match(self._root(namespace), q)
        if count_stats:
            self.num_queried_tokens += len(q)
            self.num_hit_tokens += len(slots)
        return MatchResult(slots, node)

    def claim_partial_page(self, node: RadixNode, next_tokens: Sequence[int]) -> list[int]:
        """Hand the caller a cached partial page under `node` that `next_tokens` starts with.

        Call with a match's last_node and the tokens after the match. Returns the page's filled
        slots ([] if there is none, it is pinned, or page_size is 1); the page leaves the tree and
        is the caller's from then on: it writes next_tokens[len(result):] into the rest of that
        page and later inserts or frees it like any page of its own.
        """
        self._require_attached(node)
        rest = list(next_tokens)
        for leaf in self._partial_children(node, rest):
            if leaf.lock_ref == 0:
                self._remove_leaf(leaf)
                self.num_hit_tokens += len(leaf.key)
                return leaf.value
        return []

    def insert(
        self, tokens: Sequence[int], slots: Sequence[int], namespace: Hashable = None
    ) -> InsertResult:
        """Cache tokens -> slots; keep the slots of tokens it lacked, report the duplicates.

        num_cached is how many leading tokens the tree already held. dup_slots are the given
        slots for those tokens that differ from the tree's own (slots that came from a match
        are not duplicates); the caller frees them. The tree keeps every other given slot.
        With page_size > 1, token j must sit at offset j % page_size of an aligned page,
        dup_slots are whole pages, and a partial last page is kept as a leaf (the tree then
        owns that whole page). Raises ValueError, caching nothing, on misaligned slots.
        """
        q, s = list(tokens), list(slots)
        if len(q) != len(s):
            raise ValueError(f"insert got {len(q)} tokens but {len(s)} slots")
        ps, n, i = self.page_size, len(q), 0
        node, tick, dups = self._root(namespace), self._tick(), []
        node.last_access = tick
        while i < n:
            child = node.children.get(q[i] if ps == 1 else tuple(q[i : i + ps]))
            if child is None and n - i < ps:
                child = self._covering_child(node, q[i:])
            if child is None:
                break
            edge = child.key
            cp = len(edge) if q[i : i + len(edge)] == edge else common_prefix_len(edge, q, i)
            if cp == n - i:  # everything left is cached, perhaps partway along this edge
                child.last_access = tick
                dups += dup_slots(s[i:], child.value[:cp], ps)
                i = n
                break
            aligned = cp - cp % ps
            assert aligned > 0, "a child found by its first page shares at least that page"
            is_split = aligned < len(edge)
            if is_split:
                child = self._split(child, aligned)
            child.last_access = tick
            dups += dup_slots(s[i : i + aligned], child.value, ps)
            node, i = child, i + aligned
            if is_split:
                break
        num_cached = i
        if i < n:
            check_page_structure(s[i:], ps)  # i is page-aligned; cached pages were compared
            self._add_leaf(node, q[i:], s[i:], tick)
        return InsertResult(num_cached, dups)

    def continuation(self, node: RadixNode, tokens: Sequence[int], max_tokens: int) -> list[int]:
        """What the tree holds after `node`'s prefix and then `tokens`: up to max_tokens
        tokens along the most recently used path ([] where the tree does not hold
        `tokens` there). Read-only: no split, no LRU refresh, no counters."""
        self._require_attached(node)
        q, ps, i, out = list(tokens), self.page_size, 0, []
        while len(out) < max_tokens:
            if i < len(q):
                rest = q[i:]
                child = node.children.get(rest[0] if ps == 1 else tuple(rest[:ps]))
                if child is None and len(rest) < ps:
                    child = self._covering_child(node, rest)
                if child is None:
                    return []
                cp = common_prefix_len(child.key, q, i)
                if cp < min(len(child.key), len(rest)):
                    return []  # the tree went another way
                i += cp
                out += child.key[cp : cp + max_tokens - len(out)]
            else:
                if not node.children:
                    break
                child = max(node.children.values(), key=lambda c: c.last_access)
                out += child.key[: max_tokens - len(out)]
            node = child
        return out

    def lock(self, node: RadixNode) -> None:
        """Protect node's path from eviction while a request reads it (no-op on a root)."""
        self._require_attached(node)
        if not node.is_root:
            self._num_locks += 1
            self._inc_lock(node)

    def unlock(self, node: RadixNode) -> None:
        """Undo one lock(node)."""
        if node.is_root:
            return
        if node.lock_ref <= 0 or self._num_locks <= 0:
            raise ValueError("unlock of a node that is not locked")
        self._num_locks -= 1
        self._dec_lock(node)

    def pin(self, tokens: Sequence[int], namespace: Hashable = None) -> int:
        """Keep the cached prefix of tokens resident until unpin(tokens); returns its length.

        Pins what is cached now (insert first). A pin holds a lock, so it counts in locked_size.
        """
        q = list(tokens)
        node, slots = self._match(self._root(namespace), q)
        num_pinned = len(slots)
        for leaf in self._partial_children(node, q[num_pinned:]):
            node, num_pinned = leaf, num_pinned + len(leaf.key)
            break
        self._pins.setdefault((namespace, tuple(q)), []).append(node)
        if not node.is_root:
            self._inc_lock(node)
        return num_pinned

    def unpin(self, tokens: Sequence[int], namespace: Hashable = None) -> None:
        """Undo the latest pin(tokens, namespace) still in force."""
        key = (namespace, tuple(tokens))
        nodes = self._pins.get(key)
        if not nodes:
            raise ValueError(f"no pin for namespace={namespace!r} and these {len(key[1])} tokens")
        node = nodes.pop()
        if not nodes:
            del self._pins[key]
        if not node.is_root:
            self._dec_lock(node)

    def evict(self, num_slots: int) -> list[int]:
        """Free at least num_slots slots if possible; returns them (whole pages when paged).

        Removes unlocked leaves, least recently used first; a parent whose last child goes
        becomes a leaf and competes in the same order. Whole nodes go, so it may free more.
        """
        freed: list[int] = []
        while len(freed) < num_slots:
            leaf = self._pop_lru()
            if leaf is None:
                break
            freed += whole_pages(leaf.value, self.page_size)
            self._remove_leaf(leaf)
        return freed

    def reset(self) -> list[int]:
        """Empty every namespace and drop all pins (flush_cache); returns the slots held.

        Raises RuntimeError while a request still holds a lock.
        """
        if self._num_locks:
            raise RuntimeError(f"reset() with {self._num_locks} locks held; unlock requests first")
        freed: list[int] = []
        for root in self._roots.values():
            for node in self._iter_nodes(root):
                if not node.is_root:
                    freed += whole_pages(node.value, self.page_size)
                    node.parent = None  # stale handles now fail _require_attached
        self._clear()
        return freed

    def sequences(self) -> Iterator[tuple[Hashable, list[int], list[int]]]:
        """(namespace, tokens, slots) for every root-to-leaf path; for tests and debugging."""
        for namespace, root in self._roots.items():
            stack: list[tuple[RadixNode, list[int], list[int]]] = [(root, [], [])]
            while stack:
                node, tokens, slots = stack.pop()
                tokens, slots = tokens + node.key, slots + node.value
                if not node.children and not node.is_root:
                    yield namespace, tokens, slots
                stack.extend((child, tokens, slots) for child in node.children.values())

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant (sizes, keys, locks, LRU)."""
        check_tree(self)

    def _match(self, root: RadixNode, q: list[int]) -> tuple[RadixNode, list[int]]:
        ps, n, i = self.page_size, len(q), 0
        node, tick, slots = root, self._tick(), []
        node.last_access = tick
        while n - i >= ps:
            child = node.children.get(q[i] if ps == 1 else tuple(q[i : i + ps]))
            if child is None:
                break
            edge = child.key
            cp = len(edge) if q[i : i + len(edge)] == edge else common_prefix_len(edge, q, i)
            aligned = cp - cp % ps  # whole pages only, so a partial last page is never matched
            is_split = aligned < len(edge)
            if is_split:
                child = self._split(child, aligned)
            child.last_access = tick
            slots += child.value
            node, i = child, i + aligned
            if is_split:
                break
        return node, slots
