"""Radix tree nodes and the results the tree hands back.

A node owns the edge from its parent: `key` (token ids) and `value` (their slots), equal in
length and non-empty except at a root. `lock_ref` counts the locks held on the node or any
node below it, so a parent's lock_ref is never smaller than the sum of its children's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass(slots=True, eq=False)
class RadixNode:
    """One edge of the tree; identity (not value) equality, so nodes can live in sets."""

    key: list[int]
    value: list[int]
    parent: RadixNode | None = field(default=None, repr=False)
    children: dict[int | tuple[int, ...], RadixNode] = field(default_factory=dict, repr=False)
    lock_ref: int = 0
    last_access: int = 0
    uid: int = 0

    @property
    def is_root(self) -> bool:
        return not self.key

    @property
    def is_attached(self) -> bool:
        """False once evicted, claimed or flushed; such a node must not be locked."""
        return self.parent is not None or not self.key


class MatchResult(NamedTuple):
    """`slots` of the longest cached prefix; `last_node` ends exactly at that prefix."""

    slots: list[int]
    last_node: RadixNode


class InsertResult(NamedTuple):
    """`num_cached`: leading tokens the tree already held before this insert.

    `dup_slots`: given slots the tree did not keep because it already caches those tokens
    under other slots; the caller returns them to its allocator (whole pages when paged).
    """

    num_cached: int
    dup_slots: list[int]
