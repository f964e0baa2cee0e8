"""A test instance serialized the way an engine emits JSON: MaskBench's scoring rule.

MaskBench decides an instance by its tokens "serialized the way the engine emits JSON". Its
data was put in that order once, for llguidance alone and only on the schemas llguidance
compiled (`maskbench/creation/reorder.py` in guidance-ai/jsonschemabench): elsewhere a valid
instance may list an object's keys in another order than an engine that emits them in the
schema's order would, and such an engine refuses it for its order alone (JSON objects are
unordered). `in_engine_order` asks whether the engine takes the instance with each object's
keys in some order it emits, so every engine in a run is scored by the same rule, and an
invalid instance counts as accepted where any order of its keys passes (stricter than its
own order alone).

The order is found by the engine itself, key by key, as the compact text is fed to its
matcher: of the keys the engine allows next, the first (in the instance's order) is placed
whose value then passes and after which every other of those keys is still allowed (an engine
that emits keys in the schema's order passes a key for good once one after it is placed; one
behind a required key is allowed only once that key is in). A
search is bounded (MAX_FED tokens fed, those fed again to undo included); one cut short counts
as refused and is counted apart. StepWalk and its kin feed each system's matcher (stemma's,
llguidance's, xgrammar's) as a Walk.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

MAX_FED = 400_000  # tokens fed in one instance's search, retries and undos included


class Walk(Protocol):
    """An engine's matcher fed token by token, with undo."""

    def feed(self, ids: list[int]) -> bool:
        """Accept all of `ids`, or none (False: the matcher as it was)."""

    def undo(self, num_tokens: int) -> int:
        """Undo the last `num_tokens`: the tokens fed again to do so (a matcher that rolls
        back only so far starts again and takes the rest once more)."""

    def final(self) -> bool:
        """The tokens so far are a complete match."""


class SearchCut(Exception):
    """The search fed more than its bound of tokens."""


class _NoFit(Exception):
    """No order of a value's keys fits where it stands."""


def compact(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def in_engine_order(
    data: Any, walk: Walk, tokenize: Callable[[str], list[int]], max_fed: int = MAX_FED
) -> bool:
    """Whether the engine behind `walk` (fresh, at its start) takes `data` as a complete match
    with each object's keys in an order it allows. SearchCut past `max_fed` tokens fed,
    those fed again to undo included."""
    search = _Search(walk, tokenize, max_fed)
    try:
        search.value(data)
    except _NoFit:
        return False
    return walk.final()


class _Search:
    def __init__(self, walk: Walk, tokenize: Callable[[str], list[int]], max_fed: int) -> None:
        self.walk, self.tokenize, self.fed_left = walk, tokenize, max_fed
        self.at = 0  # tokens fed and standing

    def spend(self, num_tokens: int) -> None:
        self.fed_left -= num_tokens
        if self.fed_left < 0:
            raise SearchCut

    def text(self, text: str) -> None:
        """Feed `text`; _NoFit where the engine refuses it (nothing fed)."""
        ids = self.tokenize(text)
        self.spend(len(ids))
        if not self.walk.feed(ids):
            raise _NoFit
        self.at += len(ids)

    def back(self, mark: int) -> None:
        """Undo what was fed after `mark` (an earlier `at`)."""
        if self.at > mark:
            self.spend(self.walk.undo(self.at - mark))
            self.at = mark

    def fits(self, text: str) -> bool:
        """`text` could come next (fed and undone)."""
        mark = self.at
        try:
            self.text(text)
        except _NoFit:
            return False
        self.back(mark)
        return True

    def value(self, data: Any) -> None:
        """Feed `data`, each object's keys in an order found to fit; _NoFit where none does
        (what was fed of it is left for the caller to undo)."""
        if isinstance(data, dict):
            self.object(data)
        elif isinstance(data, list):
            self.text("[")
            for i, item in enumerate(data):
                if i:
                    self.text(",")
                self.value(item)
            self.text("]")
        else:
            self.text(compact(data))

    def object(self, data: dict[str, Any]) -> None:
        self.text("{")
        left, comma = list(data), ""
        while left:
            now = [k for k in left if self.fits(f"{comma}{compact(k)}:")]
            if (key := next((k for k in now if self.place(data, k, now, comma)), None)) is None:
                raise _NoFit
            left.remove(key)
            comma = ","
        self.text("}")

    def place(self, data: dict[str, Any], key: str, now: list[str], comma: str) -> bool:
        """Feed `key` and its value next, where every other key that could come now still
        can after them (the engine passed no key by the choice); False (nothing fed) where
        they do not fit so."""
        mark = self.at
        try:
            self.text(f"{comma}{compact(key)}:")
            self.value(data[key])
        except _NoFit:
            self.back(mark)
            return False
        if all(self.fits(f",{compact(k)}:") for k in now if k != key):
            return True
        self.back(mark)
        return False


class StepWalk:
    """A Walk over a fresh matcher from `start()`, stepped by `accept(token) -> bool` (False:
    the token refused, the matcher as it was; stemma's ConstraintMatcher) and undone by its
    rollback(n); where that refuses a long undo (stemma bounds it), a fresh matcher takes
    the tokens kept."""

    def __init__(self, start: Callable[[], Any]) -> None:
        self.start, self.fed = start, []
        self.m = start()

    def accept(self, token: int) -> bool:
        return self.m.accept(token)

    def feed(self, ids: list[int]) -> bool:
        for i, token in enumerate(ids):
            if not self.accept(token):
                self.undo(i)
                return False
            self.fed.append(token)
        return True

    def undo(self, num_tokens: int) -> int:
        if not num_tokens:
            return 0
        kept = self.fed[: len(self.fed) - num_tokens]
        try:
            self.m.rollback(num_tokens)
        except ValueError:
            self.m, self.fed = self.start(), []
            if not self.feed(kept):
                raise AssertionError("a fresh matcher refused the tokens it took") from None
            return len(kept)
        self.fed = kept
        return 0

    def final(self) -> bool:
        return self.m.is_final()


class LLGuidanceWalk(StepWalk):
    """Over an llguidance LLMatcher: a piece tried whole, refused without an error state."""

    def feed(self, ids: list[int]) -> bool:
        if (n := self.m.try_consume_tokens(ids)) < len(ids):
            self.m.rollback(n)
            return False
        self.fed += ids
        return True

    def final(self) -> bool:
        return self.m.is_accepting()


class XGrammarWalk(StepWalk):
    """Over an xgrammar GrammarMatcher: final where it would take the end token."""

    def __init__(self, start: Callable[[], Any], eos: int) -> None:
        super().__init__(start)
        self.eos = eos

    def accept(self, token: int) -> bool:
        return self.m.accept_token(token)

    def final(self) -> bool:
        if not self.m.accept_token(self.eos):
            return False
        self.m.rollback(1)
        return True
