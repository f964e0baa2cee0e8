"""The radix tree's structure: namespace roots, edge split, leaf add/remove, locks, LRU heap.

Keeps evictable/locked/total sizes exact on every change, so reading them is O(1). A node is
locked while lock_ref > 0; sizes count slots held in whole pages, total_size counts tokens.
Every unlocked leaf has an entry in a lazy LRU min-heap whose time is <= its last_access: a
touch pushes nothing; a popped entry that is out of date is pushed again with the node's
current time. So eviction costs O(log n) per node, not a scan of every leaf.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterator

from .node import RadixNode
from .pages import num_page_slots


class TreeCore:
    """Structural primitives shared by RadixTree's operations; not used on its own."""

    def __init__(self, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.num_hit_tokens = 0  # counters for metrics; kept across reset()
        self.num_queried_tokens = 0
        self._clock = 0
        self._next_uid = 0
        self._clear()

    def _clear(self) -> None:
        self._roots: dict[Hashable, RadixNode] = {}
        self._leaves: set[RadixNode] = set()  # every non-root node without children
        self._lru: list[tuple[int, int, RadixNode]] = []  # (last_access, seq, leaf), lazy
        self._lru_seq = itertools.count()  # unique tie-breakers, so nodes are never compared
        self._pins: dict[tuple[Hashable, tuple[int, ...]], list[RadixNode]] = {}
        self._num_locks = 0  # lock() calls not yet undone, on non-root nodes
        self._evictable_size = 0
        self._locked_size = 0
        self._total_size = 0

    @property
    def evictable_size(self) -> int:
        """Slots in unlocked nodes (whole pages when paged)."""
        return self._evictable_size

    @property
    def locked_size(self) -> int:
        """Slots in nodes with lock_ref > 0, pinned ones included (whole pages when paged)."""
        return self._locked_size

    @property
    def total_size(self) -> int:
        """Cached tokens."""
        return self._total_size

    @property
    def num_pins(self) -> int:
        return sum(len(nodes) for nodes in self._pins.values())

    def _split(self, child: RadixNode, at: int) -> RadixNode:
        """Cut child's edge at `at` (page-aligned); the new upper node keeps child's dict key."""
        parent = child.parent
        assert parent is not None and 0 < at < len(child.key) and at % self.page_size == 0
        upper = RadixNode(
            child.key[:at],
            child.value[:at],
            parent,
            {},
            child.lock_ref,
            child.last_access,
            self._uid(),
        )
        parent.children[self._child_key(upper.key)] = upper
        child.key, child.value, child.parent = child.key[at:], child.value[at:], upper
        upper.children[self._child_key(child.key)] = child
        return upper

    def _add_leaf(self, node: RadixNode, key: list[int], value: list[int], tick: int) -> None:
        assert len(node.key) % self.page_size == 0, "only whole-page edges get children"
        leaf = RadixNode(key, value, node, {}, 0, tick, self._uid())
        self._leaves.discard(node)
        node.children[self._child_key(key)] = leaf
        self._leaves.add(leaf)
        self._evictable_size += num_page_slots(len(key), self.page_size)
        self._total_size += len(key)
        self._push_lru(leaf)

    def _remove_leaf(self, leaf: RadixNode) -> RadixNode:
        parent = leaf.parent
        assert parent is not None and not leaf.children and leaf.lock_ref == 0
        del parent.children[self._child_key(leaf.key)]
        leaf.parent = None
        self._leaves.discard(leaf)
        self._evictable_size -= num_page_slots(len(leaf.key), self.page_size)
        self._total_size -= len(leaf.key)
        if not parent.children and not parent.is_root:
            self._leaves.add(parent)
            self._push_lru(parent)
        return parent

    def _push_lru(self, node: RadixNode) -> None:
        """Queue node if it is an unlocked leaf (call when a node may have become one)."""
        if node.lock_ref or node not in self._leaves:
            return
        if len(self._lru) > 2 * len(self._leaves) + 64:  # mostly stale: rebuild from the leaves
            seq = self._lru_seq
            self._lru = [(n.last_access, next(seq), n) for n in self._leaves if n.lock_ref == 0]
            heapq.heapify(self._lru)
        else:
            heapq.heappush(self._lru, (node.last_access, next(self._lru_seq), node))

    def _pop_lru(self) -> RadixNode | None:
        """The least recently used unlocked leaf, or None; skips stale heap entries."""
        while self._lru:
            last_access, _, node = heapq.heappop(self._lru)
            if node.lock_ref or node not in self._leaves:
                continue  # locked, no longer a leaf, or gone; queued again if that changes
            if last_access == node.last_access:
                return node
            heapq.heappush(self._lru, (node.last_access, next(self._lru_seq), node))
        return None

    def _partial_children(self, node: RadixNode, rest: list[int]) -> Iterator[RadixNode]:
        """Partial-page leaves under node whose whole edge starts `rest`, longest first."""
        for r in range(min(self.page_size - 1, len(rest)), 0, -1):
            leaf = node.children.get(tuple(rest[:r]))
            if leaf is not None:
                yield leaf

    def _covering_child(self, node: RadixNode, tail: list[int]) -> RadixNode | None:
        """A child whose edge starts with `tail` (shorter than a page); scans the children."""
        r = len(tail)
        return next((c for c in node.children.values() if c.key[:r] == tail), None)

    def _inc_lock(self, node: RadixNode) -> None:
        while not node.is_root:
            if node.lock_ref == 0:
                size = num_page_slots(len(node.key), self.page_size)
                self._evictable_size -= size
                self._locked_size += size
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]  # non-root nodes have parents

    def _dec_lock(self, node: RadixNode) -> None:
        while not node.is_root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                size = num_page_slots(len(node.key), self.page_size)
                self._evictable_size += size
                self._locked_size -= size
                self._push_lru(node)
            node = node.parent  # type: ignore[assignment]

    def _require_attached(self, node: RadixNode) -> None:
        if not node.is_attached:
            raise ValueError("node is no longer in the tree (evicted, claimed or reset)")

    def _root(self, namespace: Hashable) -> RadixNode:
        root = self._roots.get(namespace)
        if root is None:
            # Namespaces may be per request (cache salts): drop the empty roots once they
            # outnumber the leaves, so they cost O(1) each and never accumulate.
            if len(self._roots) > 2 * len(self._leaves) + 64:
                kept = {ns: r for ns, r in self._roots.items() if r.children or ns is None}
                self._roots = kept
            root = self._roots[namespace] = RadixNode([], [], uid=self._uid())
        return root

    def _child_key(self, key: list[int]) -> int | tuple[int, ...]:
        return key[0] if self.page_size == 1 else tuple(key[: self.page_size])

    def _iter_nodes(self, root: RadixNode) -> Iterator[RadixNode]:
        stack = [root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _uid(self) -> int:
        self._next_uid += 1
        return self._next_uid
