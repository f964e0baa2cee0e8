"""Short strings that match a JSON schema's `pattern`s: moves for early closing's search.

Inside a string under a `pattern` the output has not matched yet (an unanchored one lets
every character through until it has), closing's one-token-at-a-time search cannot find the
match in its budget. `schema_examples` gives, for each pattern of a schema, a short string
that Python's translation of it (ecma_regex.py) finds a match in; the search then tries
writing one whole. Each is only a move to try: the constraint's own matcher takes or refuses
every token of it.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from re import _constants as c
from re import _parser as sre_parse
from typing import Any

from .ecma_regex import ecma_regex

MAX_EXAMPLES = 8  # examples kept per schema, shortest first
MAX_EXAMPLE_CHARS = 64  # longer ones are not a short way to close
MAX_PATTERNS = 256  # patterns of one schema looked at

_CATEGORY_CHAR = {
    c.CATEGORY_DIGIT: "0",
    c.CATEGORY_NOT_DIGIT: "a",
    c.CATEGORY_WORD: "a",
    c.CATEGORY_NOT_WORD: " ",
    c.CATEGORY_SPACE: " ",
    c.CATEGORY_NOT_SPACE: "a",
}
_FALLBACKS = "a0A _-.x"  # tried in turn for a negated class or a NOT_LITERAL


class _NoExample(Exception):
    """A construct this walk does not write an example for (a lookaround, say)."""


def _in_class(items: list, ch: str) -> bool:
    for op, av in items:
        if op is c.LITERAL and ord(ch) == av:
            return True
        if op is c.RANGE and av[0] <= ord(ch) <= av[1]:
            return True
        if op is c.CATEGORY and re.fullmatch(_category_regex(av), ch, re.ASCII):
            return True
    return False


def _category_regex(category: Any) -> str:
    return {
        c.CATEGORY_DIGIT: r"\d",
        c.CATEGORY_NOT_DIGIT: r"\D",
        c.CATEGORY_WORD: r"\w",
        c.CATEGORY_NOT_WORD: r"\W",
        c.CATEGORY_SPACE: r"\s",
        c.CATEGORY_NOT_SPACE: r"\S",
    }.get(category, r"(?!)")


def _class_char(items: list) -> str:
    if items and items[0][0] is c.NEGATE:
        rest = items[1:]
        for ch in _FALLBACKS:
            if not _in_class(rest, ch):
                return ch
        raise _NoExample
    op, av = items[0]
    if op is c.LITERAL:
        return chr(av)
    if op is c.RANGE:
        return chr(av[0])
    if op is c.CATEGORY and av in _CATEGORY_CHAR:
        return _CATEGORY_CHAR[av]
    raise _NoExample


def _write(tree: Any, groups: dict[int, str]) -> str:
    out = []
    for op, av in tree:
        if op is c.LITERAL:
            out.append(chr(av))
        elif op is c.NOT_LITERAL:
            out.append(next(ch for ch in _FALLBACKS if ord(ch) != av))
        elif op is c.ANY:
            out.append("a")
        elif op is c.IN:
            out.append(_class_char(av))
        elif op is c.BRANCH:  # each branch written once (nested ones would double each level)
            written = []
            for branch in av[1]:
                branch_groups = dict(groups)
                try:
                    written.append((_write(branch, branch_groups), branch_groups))
                except _NoExample:
                    continue
            if not written:
                raise _NoExample
            text, branch_groups = min(written, key=lambda w: len(w[0]))
            groups.update(branch_groups)  # the groups of the branch taken
            out.append(text)
        elif op is c.SUBPATTERN:
            text = _write(av[3], groups)
            if av[0] is not None:
                groups[av[0]] = text
            out.append(text)
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            once = _write(av[2], groups) if av[0] else ""
            if len(once) * av[0] > MAX_EXAMPLE_CHARS:  # checked before a{1000000000} is built
                raise _NoExample
            out.append(once * av[0])
        elif op is c.ATOMIC_GROUP:
            out.append(_write(av, groups))
        elif op is c.GROUPREF:
            out.append(groups.get(av, ""))
        elif op is c.AT:
            continue  # an anchor: nothing to write (the match below checks it held)
        else:  # lookarounds, conditionals
            raise _NoExample
        if sum(map(len, out)) > MAX_EXAMPLE_CHARS:
            raise _NoExample
    return "".join(out)


@lru_cache(maxsize=4096)
def pattern_example(pattern: str) -> str | None:
    """A short non-empty string that `pattern` (ECMA-262) finds a match in, or None."""
    regex = ecma_regex(pattern)
    if regex is None:
        return None
    try:
        text = _write(sre_parse.parse(regex.pattern, regex.flags), {})
    except (_NoExample, re.error, RecursionError, OverflowError):
        return None
    if not text or len(text) > MAX_EXAMPLE_CHARS or regex.search(text) is None:
        return None
    return text


def _patterns(node: Any, out: list[str]) -> None:
    stack = [node]
    while stack and len(out) < MAX_PATTERNS:
        node = stack.pop()
        if isinstance(node, dict):
            pattern = node.get("pattern")
            if isinstance(pattern, str):
                out.append(pattern)
            props = node.get("patternProperties")
            if isinstance(props, dict):
                out.extend(k for k in props if isinstance(k, str))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


@lru_cache(maxsize=256)
def schema_examples(schema_text: str) -> tuple[str, ...]:
    """For the `pattern`s (and `patternProperties` keys) of a JSON schema: each one's
    example as JSON string content (escaped, no quotes), shortest first, at most
    MAX_EXAMPLES; () for a schema without patterns or one that is not JSON."""
    try:
        schema = json.loads(schema_text)
    except (ValueError, RecursionError):
        return ()
    patterns: list[str] = []
    try:
        _patterns(schema, patterns)
    except RecursionError:
        return ()
    examples = {pattern_example(p) for p in patterns} - {None}
    escaped = sorted({json.dumps(e)[1:-1] for e in examples}, key=lambda s: (len(s), s))
    return tuple(escaped[:MAX_EXAMPLES])
