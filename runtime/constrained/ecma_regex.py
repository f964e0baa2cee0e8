"""JSON Schema `pattern`s as ECMA-262 reads them, translated to Python regexes that find the
same matches where that can be done exactly (schema_paths.py, property_order.py and
schema_redundant.py decide which keys a pattern takes); None elsewhere, and those callers
then make no claim about the pattern.
"""

from __future__ import annotations

import re
from functools import lru_cache

# ECMA-262's \s: the characters Python's re.ASCII \s leaves out are the Unicode spaces.
_ECMA_SPACE = (
    "\\t\\n\\v\\f\\r \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff"
)
_ECMA_ESCAPES = {
    ".": "[^\\n\\r\\u2028\\u2029]",  # ECMA's . stops at every line terminator
    "$": "\\Z",  # and its $ only at the end (Python's also before a final newline)
}
_SAME_ESCAPES = frozenset("dDwWsSbBtnvfr0xu")  # letters both read alike (re.ASCII)


@lru_cache(maxsize=1024)
def ecma_regex(pattern: str) -> re.Pattern[str] | None:
    """A JSON-Schema `pattern` (ECMA-262 dialect) as a Python regex that finds the same
    matches; None where a construct is outside the part translated here (named groups,
    lookbehind, backreferences, \\S inside a class, \\p, \\c, \\u{...}, ...)."""
    if not isinstance(pattern, str):
        return None
    out, i, in_class = [], 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            if i + 1 >= len(pattern):
                return None
            nxt = pattern[i + 1]
            if nxt.isalnum() and nxt not in _SAME_ESCAPES or pattern.startswith("\\u{", i):
                return None  # read otherwise by one of the two, or not at all
            if nxt == "s":
                out.append(_ECMA_SPACE if in_class else f"[{_ECMA_SPACE}]")
            elif nxt == "S":
                if in_class:
                    return None
                out.append(f"[^{_ECMA_SPACE}]")
            else:
                out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
            out.append(ch)
        elif ch == "[":
            if pattern.startswith(("[]", "[^]"), i):
                return None  # ECMA's empty and full classes; Python reads them otherwise
            in_class = True
            out.append(ch)
        elif ch == "(" and pattern.startswith(("(?<", "(?P"), i):
            return None
        else:
            out.append(_ECMA_ESCAPES.get(ch, ch))
        i += 1
    try:
        return re.compile("".join(out), re.ASCII)
    except (re.error, OverflowError):
        return None
