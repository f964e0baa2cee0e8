"""check_tree(): recompute everything a RadixTree keeps incrementally and compare.

Walks every namespace, so it costs O(cached tokens); meant for tests and debugging.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .node import RadixNode
from .pages import num_page_slots

if TYPE_CHECKING:
    from .core import TreeCore


def _require(ok: bool, what: str) -> None:
    if not ok:  # not `assert`: this must hold under python -O too
        raise AssertionError(f"radix invariant broken: {what}")


def _check_edge(tree: TreeCore, node: RadixNode, key: object, child: RadixNode) -> None:
    ps = tree.page_size
    _require(child.parent is node, f"child {child.uid} does not point back to its parent")
    _require(bool(child.key), f"node {child.uid} has an empty edge but is not a root")
    _require(len(child.key) == len(child.value), f"node {child.uid} key/value lengths differ")
    _require(key == tree._child_key(child.key), f"node {child.uid} filed under key {key!r}")
    _require(
        not child.children or len(child.key) % ps == 0,
        f"inner node {child.uid} has an edge of {len(child.key)} tokens, not whole pages",
    )
    _require(
        child.last_access <= node.last_access,
        f"node {child.uid} was used after its parent {node.uid}",
    )
    for j in range(0, len(child.value), ps):
        run = child.value[j : j + ps]
        _require(
            run[0] % ps == 0 and run == list(range(run[0], run[0] + len(run))),
            f"node {child.uid} slots {run} are not one aligned page",
        )


def _check_node(tree: TreeCore, node: RadixNode, counts: dict[str, int]) -> None:
    if node.is_root:
        _require(node.lock_ref == 0 and not node.value, "a root is locked or holds slots")
        return
    own_locks = node.lock_ref - sum(child.lock_ref for child in node.children.values())
    _require(own_locks >= 0, f"node {node.uid} lock_ref {node.lock_ref} < children's sum")
    counts["own_locks"] += own_locks
    size = num_page_slots(len(node.key), tree.page_size)
    counts["locked" if node.lock_ref else "evictable"] += size
    counts["tokens"] += len(node.key)
    _require((node in tree._leaves) == (not node.children), f"leaf set wrong at {node.uid}")


def check_tree(tree: TreeCore) -> None:
    """Raise AssertionError naming the first invariant that does not hold."""
    counts = {"own_locks": 0, "locked": 0, "evictable": 0, "tokens": 0, "leaves": 0}
    seen_slots: set[int] = set()
    for root in tree._roots.values():
        _require(root.parent is None and not root.key, "a namespace root has a parent or edge")
        stack = [root]
        while stack:
            node = stack.pop()
            _check_node(tree, node, counts)
            counts["leaves"] += not node.children and not node.is_root
            num_slots = len(seen_slots)
            seen_slots.update(node.value)
            _require(len(seen_slots) == num_slots + len(node.value), f"slot reused {node.uid}")
            for key, child in node.children.items():
                _check_edge(tree, node, key, child)
                stack.append(child)
    queued: dict[int, int] = {}  # id(node) -> its oldest entry's time in the LRU heap
    for last_access, _, node in tree._lru:
        queued[id(node)] = min(last_access, queued.get(id(node), last_access))
    for leaf in tree._leaves:
        queued_ok = leaf.lock_ref > 0 or queued.get(id(leaf), leaf.last_access + 1) <= (
            leaf.last_access
        )
        _require(queued_ok, f"unlocked leaf {leaf.uid} has no LRU heap entry at or before its use")
    pinned = [node for nodes in tree._pins.values() for node in nodes if not node.is_root]
    _require(all(node.is_attached and node.lock_ref > 0 for node in pinned), "pin lost")
    _require(counts["own_locks"] == tree._num_locks + len(pinned), "lock count mismatch")
    _require(counts["locked"] == tree.locked_size, f"locked_size {tree.locked_size} != walk")
    _require(counts["evictable"] == tree.evictable_size, "evictable_size does not add up")
    _require(counts["tokens"] == tree.total_size, f"total_size {tree.total_size} != walk")
    _require(counts["leaves"] == len(tree._leaves), "leaf set holds nodes not in the tree")
