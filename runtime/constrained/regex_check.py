"""Up-front regex validation: a pattern in outlines-core's dialect, or a ValueError naming the
feature a DFA cannot honour (lookaround, backreferences, inner anchors, lazy or possessive
quantifiers, word boundaries) and where it is. A leading `^` / trailing `$` is dropped: the
whole output always has to match anyway.
"""

from __future__ import annotations

_GROUP_FEATURES = {
    "(?=": "lookahead",
    "(?!": "negative lookahead",
    "(?<=": "lookbehind",
    "(?<!": "negative lookbehind",
    "(?>": "atomic group",
    "(?P=": "backreference",
    "(?#": "inline comment",
}
_ESCAPE_FEATURES = {
    "b": r"word boundary \b",
    "B": r"word boundary \B",
    "<": r"word boundary \<",
    ">": r"word boundary \>",
    "A": r"anchor \A",
    "z": r"anchor \z",
    "Z": r"anchor \Z",
    "G": r"anchor \G",
    "k": "named backreference",
}


def normalize_regex(regex: str) -> str:
    """Drop a leading ^ and trailing $; raise ValueError naming any unsupported feature."""
    if regex.startswith("^"):
        regex = regex[1:]
    if regex.endswith("$") and _num_backslashes_before(regex, len(regex) - 1) % 2 == 0:
        regex = regex[:-1]
    scan_regex(regex)
    return regex


def _num_backslashes_before(text: str, idx: int) -> int:
    n = 0
    while idx - n - 1 >= 0 and text[idx - n - 1] == "\\":
        n += 1
    return n


def _unsupported(feature: str, regex: str, pos: int) -> ValueError:
    where = regex[max(0, pos - 10) : pos + 10]
    return ValueError(
        f"regex feature not supported by constrained decoding: {feature} at position {pos} "
        f"(near {where!r}); the outlines backend builds a DFA, which has no lookaround, "
        "backreferences, anchors inside the pattern, or lazy/possessive quantifiers"
    )


def scan_regex(regex: str) -> None:
    """Walk the pattern once, tracking escapes and (nested) classes, rejecting by name."""
    i, class_depth, after_quantifier = 0, 0, False
    while i < len(regex):
        ch = regex[i]
        if ch == "\\":
            nxt = regex[i + 1 : i + 2]
            if class_depth == 0 and (nxt in _ESCAPE_FEATURES or nxt.isdigit() and nxt != "0"):
                raise _unsupported(_ESCAPE_FEATURES.get(nxt, "backreference"), regex, i)
            i += 2
            if nxt in ("x", "u", "p", "P") and regex[i : i + 1] == "{":
                i = regex.find("}", i) + 1 or len(regex)
            after_quantifier = False
            continue
        if class_depth:
            if regex.startswith("[:", i):
                i = regex.find(":]", i) + 2 or len(regex)
                continue
            class_depth += {"[": 1, "]": -1}.get(ch, 0)
            i += 1
            continue
        if ch == "[":
            class_depth, i = 1, i + 1 + (regex[i + 1 : i + 2] == "^")
            i += regex[i : i + 1] == "]"  # a leading ] is a literal
            after_quantifier = False
            continue
        if ch == "(" and regex.startswith("(?", i):
            i = _scan_group_prefix(regex, i)
            after_quantifier = False
            continue
        if ch in "^$":
            raise _unsupported(f"anchor {ch}", regex, i)
        if ch in "*+?" and after_quantifier:
            raise _unsupported(
                "lazy quantifier" if ch == "?" else "possessive quantifier", regex, i
            )
        if ch == "{" and (end := regex.find("}", i)) > i:
            i, after_quantifier = end + 1, True
            continue
        after_quantifier = ch in "*+?"
        i += 1


def _scan_group_prefix(regex: str, i: int) -> int:
    """Index just past a `(?...` group prefix; raises for lookaround and friends."""
    for prefix, feature in _GROUP_FEATURES.items():
        if regex.startswith(prefix, i):
            raise _unsupported(feature, regex, i)
    j = i + 2
    while j < len(regex) and regex[j] not in ":)<P'":
        if regex[j] == "U":
            raise _unsupported("ungreedy flag (?U)", regex, i)
        j += 1
    return j + 1 if j < len(regex) and regex[j] in ":)" else j
