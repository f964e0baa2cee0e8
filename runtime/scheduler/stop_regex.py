"""Stop regexes in linear time. A pattern, parsed by the stdlib's own regex parser, compiles
to a Thompson NFA; `RegexSearch` runs it as an unanchored search over a lazily built DFA, so
each character costs one cached transition (building a new one costs at most the NFA's size).
What has no finite automaton (backreferences, lookaround, atomic groups, possessive repeats,
`$`, `\\Z`, `\\b`, `\\B`) is refused by `compile_stop_regex`, naming the pattern.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

try:  # Python >= 3.11
    from re import _constants as sre
    from re import _parser as sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as sre  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

# One search's DFA cache starts over past either bound: its memory stays under a few MiB.
MAX_DFA_STATES = 2048
MAX_CACHED_NFA_STATES = 1 << 16  # NFA states held by all cached DFA states together
CHAR, EPS, AT_TEXT_START, AT_LINE_START, MATCH = range(5)  # NFA state kinds

_FLAG_I, _FLAG_M, _FLAG_S, _FLAG_A = (
    sre.SRE_FLAG_IGNORECASE,
    sre.SRE_FLAG_MULTILINE,
    sre.SRE_FLAG_DOTALL,
    sre.SRE_FLAG_ASCII,
)
_REFUSED = {
    sre.GROUPREF: "backreferences",
    sre.GROUPREF_EXISTS: "conditional groups",
    sre.ASSERT: "lookaround",
    sre.ASSERT_NOT: "lookaround",
}
_ASCII_SPACE = frozenset(" \t\n\r\f\v")


@dataclass(slots=True)
class Nfa:
    """States 0..n-1; state i has kind[i] and, for CHAR, a predicate pred[i] and one target;
    for EPS / AT_* the targets it reaches without a character (AT_* only where it holds)."""

    pattern: str
    kind: list[int] = field(default_factory=list)
    pred: list[Callable[[str], bool] | None] = field(default_factory=list)
    out: list[tuple[int, ...]] = field(default_factory=list)
    start: int = 0
    max_states: int = 4096

    def add(self, kind: int, pred: Callable[[str], bool] | None = None, out=()) -> int:
        if len(self.kind) >= self.max_states:
            raise _TooLarge
        self.kind.append(kind)
        self.pred.append(pred)
        self.out.append(tuple(out))
        return len(self.kind) - 1

    def closure(self, states, at_text_start: bool, at_line_start: bool) -> frozenset[int]:
        """The CHAR and MATCH states reachable from `states` without a character."""
        seen, stack, found = set(states), list(states), []
        while stack:
            s = stack.pop()
            k = self.kind[s]
            if k == CHAR or k == MATCH:
                found.append(s)
                continue
            if (k == AT_TEXT_START and not at_text_start) or (
                k == AT_LINE_START and not at_line_start
            ):
                continue
            for t in self.out[s]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(found)


class _TooLarge(Exception):
    pass


class AutomatonTooLarge(ValueError):
    """A stop regex needs more NFA states than its budget allows."""


def compile_stop_regex(pattern: str, max_states: int, flag: str) -> Nfa:
    """The NFA of one stop regex; ValueError naming the pattern when it has no finite
    automaton or needs more than `max_states` states (named by `flag`)."""
    try:
        parsed = sre_parse.parse(pattern)
    except (sre.error, RecursionError, OverflowError) as e:
        raise ValueError(f"stop_regex {pattern!r} does not compile: {e}") from None
    nfa = Nfa(pattern, max_states=max_states)
    try:
        match = nfa.add(MATCH)
        nfa.start = _Builder(nfa).seq(list(parsed), parsed.state.flags, match)
    except _TooLarge:
        raise AutomatonTooLarge(
            f"stop_regex {pattern!r} needs more than {max_states} automaton states; "
            f"the limit is {max_states} ({flag})"
        ) from None
    except RecursionError:
        raise ValueError(f"stop_regex {pattern!r} is nested too deeply") from None
    return nfa


class _Builder:
    """Builds NFA fragments back to front: each call gets the state to continue to."""

    def __init__(self, nfa: Nfa):
        self.nfa = nfa
        self.num_copies = 0  # repeat bodies built; an empty body adds no state but costs time

    def seq(self, items: list, flags: int, nxt: int) -> int:
        for op, av in reversed(items):
            nxt = self.item(op, av, flags, nxt)
        return nxt

    def item(self, op, av, flags: int, nxt: int) -> int:
        nfa = self.nfa
        if op in (sre.LITERAL, sre.NOT_LITERAL, sre.ANY, sre.IN):
            return nfa.add(CHAR, _char_pred(op, av, flags), (nxt,))
        if op is sre.BRANCH:
            return nfa.add(EPS, out=[self.seq(list(b), flags, nxt) for b in av[1]])
        if op is sre.SUBPATTERN:
            _group, add, remove, sub = av
            return self.seq(list(sub), (flags | add) & ~remove, nxt)
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            return self.repeat(av, flags, nxt)
        if op is sre.AT and av in (sre.AT_BEGINNING, sre.AT_BEGINNING_STRING):
            line = av is sre.AT_BEGINNING and flags & _FLAG_M
            return nfa.add(AT_LINE_START if line else AT_TEXT_START, out=(nxt,))
        what = _REFUSED.get(op) or (
            "end anchors and word boundaries" if op is sre.AT else f"{str(op).lower()}"
        )
        raise ValueError(
            f"stop_regex {nfa.pattern!r} uses {what}, which a linear-time matcher cannot "
            f"run; allowed: literals, classes, groups, alternation, repeats, ^ and \\A"
        )

    def repeat(self, av, flags: int, nxt: int) -> int:
        """x{lo,hi}: lo copies, then hi - lo nested optional copies (or a loop when
        unbounded). Greedy or lazy does not change which texts match."""
        lo, hi, sub = av
        body = list(sub)
        cont = nxt
        if hi is sre.MAXREPEAT or hi == sre.MAXREPEAT:
            loop = self.nfa.add(EPS)
            self.nfa.out[loop] = (self.seq(body, flags, loop), nxt)
            cont = loop
        else:
            for _ in range(hi - lo):
                self._count_copy()
                cont = self.nfa.add(EPS, out=(self.seq(body, flags, cont), nxt))
        for _ in range(lo):
            self._count_copy()
            cont = self.seq(body, flags, cont)
        return cont

    def _count_copy(self) -> None:
        self.num_copies += 1
        if self.num_copies > self.nfa.max_states:
            raise _TooLarge


def _char_pred(op, av, flags: int) -> Callable[[str], bool]:
    if op is sre.ANY:
        return (lambda ch: True) if flags & _FLAG_S else (lambda ch: ch != "\n")
    if op is sre.IN:
        base = _class_pred(av, flags)
    else:
        lit = chr(av)
        base = (lambda ch: ch == lit) if op is sre.LITERAL else (lambda ch: ch != lit)
        if op is sre.NOT_LITERAL and flags & _FLAG_I:
            return lambda ch: all(base(v) for v in _case_variants(ch))
    if flags & _FLAG_I:
        return lambda ch: any(base(v) for v in _case_variants(ch))
    return base


def _case_variants(ch: str) -> set[str]:
    return {v for v in (ch, ch.lower(), ch.upper()) if len(v) == 1}


def _class_pred(items, flags: int) -> Callable[[str], bool]:
    negate, chars, ranges, cats = False, set(), [], []
    for op, av in items:
        if op is sre.NEGATE:
            negate = True
        elif op is sre.LITERAL:
            chars.add(chr(av))
        elif op is sre.RANGE:
            ranges.append((chr(av[0]), chr(av[1])))
        elif op is sre.CATEGORY:
            cats.append(_category(av, bool(flags & _FLAG_A)))
        else:
            raise ValueError(f"unsupported character class item {op}")

    def pred(ch: str) -> bool:
        hit = ch in chars or any(a <= ch <= b for a, b in ranges) or any(c(ch) for c in cats)
        return hit != negate

    return pred


def _category(cat, is_ascii: bool) -> Callable[[str], bool]:
    """sre's categories: Unicode by default, ASCII under (?a)."""
    if cat in (sre.CATEGORY_DIGIT, sre.CATEGORY_NOT_DIGIT):
        f = (lambda ch: "0" <= ch <= "9") if is_ascii else str.isdecimal
    elif cat in (sre.CATEGORY_SPACE, sre.CATEGORY_NOT_SPACE):
        f = _ASCII_SPACE.__contains__ if is_ascii else str.isspace
    elif cat in (sre.CATEGORY_WORD, sre.CATEGORY_NOT_WORD):
        f = (lambda ch: ch.isascii() and (ch.isalnum() or ch == "_")) if is_ascii else _is_word
    else:
        raise ValueError(f"unsupported category {cat}")
    if cat in (sre.CATEGORY_NOT_DIGIT, sre.CATEGORY_NOT_SPACE, sre.CATEGORY_NOT_WORD):
        return lambda ch: not f(ch)
    return f


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


class RegexSearch:
    """One request's unanchored search for one stop regex, fed character by character. Its
    DFA states are sets of NFA states, built on first use and cached (the cache starts over
    past MAX_DFA_STATES), so a character costs one dict lookup once its transition exists."""

    def __init__(self, nfa: Nfa):
        self.nfa = nfa
        self.num_built = 0  # NFA states examined building transitions: the only non-O(1) work
        self._reset()
        self.state = self._intern(nfa.closure([nfa.start], True, True))

    def _reset(self) -> None:
        self._ids: dict[frozenset[int], int] = {}
        self._sets: list[frozenset[int]] = []
        self._trans: list[dict[str, int]] = []
        self._num_trans = 0
        self._num_cached = 0  # sum of len(states) over the cached DFA states

    def _intern(self, states: frozenset[int]) -> int:
        idx = self._ids.get(states)
        if idx is None:
            idx = self._ids[states] = len(self._sets)
            self._sets.append(states)
            self._trans.append({})
            self._num_cached += len(states)
        return idx

    def is_matched(self) -> bool:
        return _MATCH in self._sets[self.state]

    def feed(self, chars: str) -> int | None:
        """Advance over `chars`; how many of them end the first match (0: one had ended
        already), or None when no match has ended."""
        if self.is_matched():
            return 0
        for i, ch in enumerate(chars):
            nxt = self._trans[self.state].get(ch)
            self.state = self._build(ch) if nxt is None else nxt
            if _MATCH in self._sets[self.state]:
                return i + 1
        return None

    def _build(self, ch: str) -> int:
        full = len(self._sets) >= MAX_DFA_STATES or self._num_cached >= MAX_CACHED_NFA_STATES
        if full or self._num_trans >= 16 * MAX_DFA_STATES:
            current = self._sets[self.state]
            self._reset()
            self.state = self._intern(current)
        nfa, current = self.nfa, self._sets[self.state]
        targets = [nfa.out[s][0] for s in current if nfa.kind[s] == CHAR and nfa.pred[s](ch)]
        targets.append(nfa.start)  # unanchored: a match may start at every position
        nxt_set = nfa.closure(targets, False, ch == "\n")
        self.num_built += len(current) + len(nxt_set)
        nxt = self._intern(nxt_set)
        self._trans[self.state][ch] = nxt
        self._num_trans += 1
        return nxt


_MATCH = 0  # compile_stop_regex adds the MATCH state first


def match_start(nfa: Nfa, text: str, end: int) -> int:
    """The leftmost i such that text[i:end] matches, given that a match ends at `end`: the
    NFA run backwards from its MATCH state, in time linear in end - i."""
    rev_char: dict[int, list[int]] = {}
    rev_eps: dict[int, list[int]] = {}
    for s, (kind, out) in enumerate(zip(nfa.kind, nfa.out)):
        for t in out:
            (rev_char if kind == CHAR else rev_eps).setdefault(t, []).append(s)
    best, k, live = end, end, {_MATCH}
    while live:
        at_line = k == 0 or text[k - 1] == "\n"
        stack = list(live)
        while stack:  # the states from which `live` is reached without a character
            for p in rev_eps.get(stack.pop(), ()):
                kind = nfa.kind[p]
                holds = kind == EPS or (kind == AT_TEXT_START and k == 0)
                if (holds or (kind == AT_LINE_START and at_line)) and p not in live:
                    live.add(p)
                    stack.append(p)
        if nfa.start in live:
            best = k
        if k == 0:
            break
        ch = text[k - 1]
        live = {s for t in live for s in rev_char.get(t, ()) if nfa.pred[s](ch)}
        k -= 1
    return best
