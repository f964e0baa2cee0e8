"""StopMatcher: one request's stop strings and stop regexes over its incrementally decoded
output. Each new character is looked at once: a stop string only in the window where it could
end, each regex through one DFA transition (stop_regex.py), so a step costs its new text times
the number of stops, never a rescan of the output.

What matches first is what ends first (a stop string before a regex ending at the same
character, then list order); a regex's reported text starts as far left as a match ending
there can, which is what `re.search` returns on the text up to that character.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..sampling.params import SamplingParams
from ..tokenizer import IncrementalDetokenizer, Tokenizer
from .stop_regex import AutomatonTooLarge, Nfa, RegexSearch, compile_stop_regex, match_start

DEFAULT_MAX_STOP_REGEX_STATES = 4096


@dataclass(slots=True)
class StopSpec:
    """A request's stops, compiled once and shared by its n samples."""

    stops: list[str]
    nfas: list[Nfa]
    skip_special_tokens: bool = True

    @staticmethod
    def compile(
        p: SamplingParams, max_states: int = DEFAULT_MAX_STOP_REGEX_STATES
    ) -> StopSpec | None:
        """None without stops; ValueError naming a regex that cannot run in linear time or
        whose automata together exceed `max_states`."""
        if not p.stop and not p.stop_regex:
            return None
        nfas, left = [], max_states
        flag = "--max-stop-regex-states"
        for pattern in p.stop_regex:
            try:
                nfas.append(compile_stop_regex(pattern, left, flag))
            except AutomatonTooLarge:  # name the request's budget, not what was left of it
                raise ValueError(
                    f"the stop regexes need more than {max_states} automaton states "
                    f"together (at {pattern!r}); the limit is {max_states} ({flag})"
                ) from None
            left -= len(nfas[-1].kind)
        return StopSpec(list(p.stop), nfas, p.skip_special_tokens)

    def matcher(self, tokenizer: Tokenizer) -> StopMatcher:
        detok = IncrementalDetokenizer(tokenizer, self.skip_special_tokens)
        longest = max((len(s) for s in self.stops), default=0)
        return StopMatcher(self, detok, [RegexSearch(n) for n in self.nfas], longest)


def compile_stops(params: list[SamplingParams], max_states: int) -> list[StopSpec | None]:
    """Each item's StopSpec, compiled once per SamplingParams object (n samples share one)."""
    specs: dict[int, StopSpec | None] = {}
    for p in params:
        if id(p) not in specs:
            specs[id(p)] = StopSpec.compile(p, max_states)
    return [specs[id(p)] for p in params]


@dataclass(slots=True)
class StopMatcher:
    spec: StopSpec
    detok: IncrementalDetokenizer
    searches: list[RegexSearch]
    longest_stop: int
    num_ids: int = 0  # output ids decoded so far
    pieces: list[str] = field(default_factory=list)  # the decoded text, in pieces
    num_chars: int = 0
    tail: str = ""  # the last longest_stop - 1 characters: where a stop string may begin

    def feed(self, output_ids: list[int]) -> str | None:
        """Decode the ids not seen yet; the matched stop string or regex text, if one ended."""
        new = self.detok.push(output_ids[self.num_ids :])
        self.num_ids = len(output_ids)
        if not new and self.num_chars:
            return None
        window = self.tail + new
        best: tuple[int, str] | None = None  # (end in `new`, matched)
        for s in self.spec.stops:
            idx = window.find(s)
            if idx >= 0 and (best is None or idx + len(s) - len(self.tail) < best[0]):
                best = (idx + len(s) - len(self.tail), s)
        limit = len(new) if best is None else best[0] - 1  # a string wins a tie
        found: tuple[int, int] | None = None  # (end in `new`, regex index)
        for i, search in enumerate(self.searches):
            if limit < 0:
                break
            end = search.feed(new[:limit])
            if end is not None:  # a later regex must end strictly earlier
                found, limit = (end, i), end - 1
        self.pieces.append(new)
        self.num_chars += len(new)
        keep = max(self.longest_stop - 1, 0)
        self.tail = window[len(window) - keep :] if keep else ""
        if found is not None:
            return self._regex_text(found[1], self.num_chars - len(new) + found[0])
        return None if best is None else best[1]

    def _regex_text(self, idx: int, end: int) -> str:
        text = "".join(self.pieces)
        self.pieces = [text]
        return text[match_start(self.spec.nfas[idx], text, end) : end]


class StopPrefixes:
    """What a stream may show: how much of each stop string the text ends with (a stop string
    may be starting) and where the first complete one starts, advanced per new character by
    Knuth-Morris-Pratt, so each update costs the new text, not a rescan."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.fails = [_failure(s) for s in self.stops]
        self.states = [0] * len(self.stops)  # per stop: the prefix of it the text ends with
        self.first: int | None = None  # where the first complete stop string starts
        self.num_chars = 0

    def shown(self, text: str) -> int:
        """Advance over text[num_chars:]; how many leading characters of `text` may show."""
        start, self.num_chars = self.num_chars, len(text)
        held = 0
        for j, s in enumerate(self.stops):
            k, fail, n = self.states[j], self.fails[j], len(s)
            for i in range(start, len(text)):
                if k == n:
                    k = fail[k - 1]
                while k and s[k] != text[i]:
                    k = fail[k - 1]
                if s[k] == text[i]:
                    k += 1
                    if k == n and (self.first is None or i + 1 - n < self.first):
                        self.first = i + 1 - n
            self.states[j] = k
            held = max(held, k if k < n else fail[n - 1])
        cut = len(text) - held
        return cut if self.first is None else min(cut, self.first)


def _failure(s: str) -> list[int]:
    """fail[i]: the longest proper prefix of s[: i + 1] that is also its suffix."""
    fail, k = [0] * len(s), 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = fail[k - 1]
        if s[i] == s[k]:
            k += 1
        fail[i] = k
    return fail
