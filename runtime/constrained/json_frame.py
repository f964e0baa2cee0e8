"""An open container as `JsonScanner` (json_scanner.py) keeps it: its place in its parent (an
index or a key), whether its items must be unique and those seen so far, and, for an object,
its key rule, its keys so far, the values of the keys a condition watches and the broken
conditional rules waiting on them. A copy shares what it never changes in place.
"""

from __future__ import annotations

from typing import Any

from .instance_paths import Condition
from .key_presence import viable
from .property_order import KeyRule


class Frame:
    __slots__ = (
        "is_array",
        "at",
        "unique",
        "seen",
        "texts",
        "tried",
        "item_start",
        "in_item",
        "rule",
        "keys",
        "key_texts",
        "checks",
        "watch",
        "values",
        "pending",
    )

    def __init__(
        self,
        is_array: bool,
        unique: bool,
        rule: KeyRule | None = None,
        checks: tuple[Any, ...] = (),
        watch: frozenset[str] = frozenset(),
    ) -> None:
        self.is_array, self.unique, self.rule = is_array, unique, rule
        self.checks, self.watch = checks, watch  # conditional rules; the keys they read
        self.at: Any = 0 if is_array else None  # current index or key
        self.seen: set[Any] = set()  # canonical items taken
        self.texts: list[bytes] = []  # and as written
        self.tried: set[Any] = set()  # canonical items completed on a trial copy
        self.item_start, self.in_item = 0, False
        # an object's keys so far, and as written; replaced, never changed, so copies share them
        self.keys: frozenset[str] = frozenset()
        self.key_texts: tuple[bytes, ...] = ()
        self.values: dict[str, Any] = {}  # watched keys' values (canonical), replaced too
        # conditional rules broken by an inner object, each waiting on the conditions still
        # unknown (the deepest of them on this object's keys)
        self.pending: tuple[tuple[Condition, ...], ...] = ()

    def copy(self) -> Frame:
        f = Frame(self.is_array, self.unique, self.rule, self.checks, self.watch)
        f.at, f.seen, f.texts = self.at, self.seen, self.texts
        f.item_start, f.in_item = self.item_start, self.in_item
        f.keys, f.key_texts = self.keys, self.key_texts
        f.values, f.pending = self.values, self.pending
        return f

    def has_room(self, name: str | None) -> bool:
        """One more key (`name`, or one not required) leaves room for the missing ones."""
        rule = self.rule
        if rule is None or rule.max_count is None:
            return True
        missing = rule.required - self.keys - {name}
        return len(self.keys) + 1 + len(missing) <= rule.max_count

    def key_pool(self) -> frozenset[str] | None:
        """The keys that may still come, where they are finitely many (None: any key)."""
        rule = self.rule
        if rule is None:
            return None
        if rule.names is not None:
            pool = frozenset(n for n in rule.names - self.keys if self.has_room(n))
            return pool if rule.formula is None else viable(rule.formula, self.keys, pool)
        if self.has_room(None):
            return None
        return frozenset(n for n in rule.required - self.keys if self.has_room(n))
