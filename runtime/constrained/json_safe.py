"""Whether a string schema's `pattern` can put '"', '\\' or a control character inside the JSON
string that outlines-core pastes it into.

Read off the pattern's syntax tree in one pass (Python's own regex parser, after rewriting
the few outlines-core / Rust spellings it lacks), never by building an automaton: a pattern
such as `(a|b)*a(a|b){26}` has a 2^27-state DFA, and the check must cost only time linear in
the pattern. A piece counts only when every piece concatenated with it can match something,
so `[^"]*` is safe and `a"{0}` is safe too. Where the answer is unclear (Unicode classes
outside letters, numbers, marks, symbols and separators, negated Unicode classes, class set
operations) the pattern counts as unsafe.
"""

from __future__ import annotations

import re
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

UNSAFE = frozenset([*range(1, 0x20), ord('"'), ord("\\")])
_SPACE = frozenset(b" \t\n\v\f\r\x1c\x1d\x1e\x1f")
_CATEGORY_CONTAINS = {  # category -> which unsafe characters it holds
    sre.CATEGORY_DIGIT: frozenset(),
    sre.CATEGORY_WORD: frozenset(),
    sre.CATEGORY_SPACE: UNSAFE & _SPACE,
    sre.CATEGORY_NOT_DIGIT: UNSAFE,
    sre.CATEGORY_NOT_WORD: UNSAFE,
    sre.CATEGORY_NOT_SPACE: UNSAFE - _SPACE,
}
_POSIX = {
    "alpha": "a-zA-Z",
    "alnum": "a-zA-Z0-9",
    "digit": "0-9",
    "xdigit": "0-9a-fA-F",
    "upper": "A-Z",
    "lower": "a-z",
    "word": "a-zA-Z0-9_",
    "blank": " \\t",
}
# Unicode classes known to hold no ASCII punctuation, space or control; any other is unsafe.
_SAFE_CATEGORY_HEADS = ("l", "n", "m", "s", "z")  # letters, numbers, marks, symbols, separators
_SAFE_UNICODE_NAMES = frozenset(
    "letter number mark symbol separator alphabetic alpha uppercase lowercase digit latin greek "
    "cyrillic armenian hebrew arabic devanagari bengali gurmukhi gujarati tamil telugu kannada "
    "malayalam sinhala thai lao tibetan myanmar georgian hangul ethiopic khmer mongolian "
    "hiragana katakana han bopomofo".split()
)
_UNICODE_CLASS = re.compile(r"\\([pP])(\{[^}]*\}|[A-Za-z])")
_SAFE_STAND_IN = "\u0100"  # a letter: what a letter/number/script class may match
_UNSAFE_STAND_IN = "\\x01"


def can_match_unsafe(pattern: str) -> bool:
    """Whether some full match of `pattern` holds '"', '\\' or a control character;
    ValueError when the pattern cannot be read (nested too deeply, or bad syntax)."""
    if re.search(r"\[[^\]]*(&&|--|~~)", pattern):
        return True  # class set operations: Python's parser would read them as literals
    try:
        tree = sre_parse.parse(_pythonic(pattern))
        return _walk(list(tree))[1]
    except RecursionError:
        raise ValueError("the pattern is nested too deeply to check") from None
    except OverflowError as err:  # a repetition past 2^32
        raise ValueError(f"the pattern does not compile: {err}") from None
    except re.error as err:
        raise ValueError(f"the pattern does not parse: {err}") from None


def _pythonic(pattern: str) -> str:
    """outlines-core's spellings that Python's parser lacks, as Python spellings of a class
    holding the same unsafe characters."""
    pattern = _UNICODE_CLASS.sub(_unicode_stand_in, pattern)
    pattern = re.sub(r"\\x\{([0-9A-Fa-f]{1,8})\}", lambda m: f"\\U{int(m[1], 16):08x}", pattern)
    pattern = re.sub(r"\(\?<(?![=!])", "(?P<", pattern)
    return re.sub(r"\[:(\^?)([a-z]+):\]", _posix_stand_in, pattern)


def _unicode_stand_in(m: re.Match[str]) -> str:
    name = re.sub(r"[\s_-]", "", m[2].strip("{}")).lower()
    name = name.split("=")[-1].removeprefix("is")
    is_category = len(name) <= 2 and name[:1] in _SAFE_CATEGORY_HEADS
    is_long_name = any(name.endswith(word) for word in _SAFE_UNICODE_NAMES)
    is_safe = m[1] == "p" and bool(name) and (is_category or is_long_name)
    return _SAFE_STAND_IN if is_safe else _UNSAFE_STAND_IN


def _posix_stand_in(m: re.Match[str]) -> str:
    if m[1] or m[2] not in _POSIX:  # negated, or cntrl / punct / print / graph / space / ascii
        return _UNSAFE_STAND_IN
    return _POSIX[m[2]]


def _walk(items: list[tuple[Any, Any]]) -> tuple[bool, bool]:
    """(can match anything at all, can a match hold an unsafe character) of a sequence."""
    pieces = [_piece(op, av) for op, av in items]
    is_possible = all(possible for possible, _ in pieces)
    return is_possible, is_possible and any(unsafe for _, unsafe in pieces)


def _piece(op: Any, av: Any) -> tuple[bool, bool]:
    if op is sre.LITERAL:
        return True, av in UNSAFE
    if op in (sre.NOT_LITERAL, sre.ANY):
        return True, True
    if op is sre.IN:
        return True, _class_is_unsafe(av)
    if op is sre.SUBPATTERN:
        return _walk(list(av[-1]))
    if op is sre.BRANCH:
        branches = [_walk(list(b)) for b in av[1]]
        return any(p for p, _ in branches), any(u for _, u in branches)
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
        low, high, sub = av
        if high == 0:
            return True, False
        possible, unsafe = _walk(list(sub))
        return possible or low == 0, unsafe
    if op is sre.AT:
        return True, False
    return True, True  # backreferences, lookaround: refused elsewhere; unsafe here


def _class_is_unsafe(items: list[tuple[Any, Any]]) -> bool:
    held: set[int] = set()
    for op, av in items:
        if op is sre.LITERAL and av in UNSAFE:
            held.add(av)
        elif op is sre.RANGE:
            held |= {c for c in UNSAFE if av[0] <= c <= av[1]}
        elif op is sre.CATEGORY:
            held |= _CATEGORY_CONTAINS.get(av, UNSAFE)
    if items and items[0][0] is sre.NEGATE:
        return held != UNSAFE
    return bool(held)
