"""Which keys an object has, as a formula: an `anyOf` / `oneOf` whose branches say only which
keys are there (`required`, a property that is `false`, and `allOf` / `anyOf` / `oneOf` /
`not` of those) is checked beside the grammar under `property_order="any"`, at the object's
closing brace, rather than in the grammar, which would keep the object's properties in the
schema's order (property_order.py). A key after which no set of keys still allowed can make
the formula true is refused at its closing quote, so decoding does not walk into an object it
cannot close.

A formula is True, False, ("has", name), ("not", f), ("all", fs), ("any", fs) or ("one", fs)
(exactly one holds), over an instance known to be an object.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

from .schema_logic import ASSERTIONS, SchemaLogic, as_list, pointer, type_set

Formula = Any
MAX_DEPTH = 16  # nested combinators and $refs followed
MAX_FREE = 10  # keys left open that the early check tries every presence of (2**10 sets)
_COMBINED = {"allOf": "all", "anyOf": "any", "oneOf": "one"}


def disjunction_formula(root: Any, s: dict[str, Any]) -> Formula | None:
    """The formula the `anyOf` / `oneOf` of `s` say, where `s` admits only objects (which
    may be theirs to say: without them, `s` says `"type": "object"`) and they say only which
    keys are there; None elsewhere."""
    parts = [{key: s[key]} for key in ("anyOf", "oneOf") if isinstance(s.get(key), list)]
    if not parts or SchemaLogic(root).types(s, 0) != {"object"}:
        return None
    formulas = [presence(root, part, 0) for part in parts]
    if None in formulas:
        return None
    return formulas[0] if len(formulas) == 1 else ("all", tuple(formulas))


def presence(root: Any, s: Any, depth: int) -> Formula | None:
    """What `s` says of an object, where it says only which keys are there; None elsewhere."""
    if isinstance(s, bool):
        return s
    if not isinstance(s, dict) or depth > MAX_DEPTH:
        return None
    terms: list[Formula] = []
    for key, value in s.items():
        if key not in ASSERTIONS:
            continue
        if key == "type":
            terms.append("object" in type_set(value))
        elif key == "required" and all(isinstance(k, str) for k in as_list(value)):
            terms += [("has", k) for k in as_list(value)]
        elif key == "properties" and isinstance(value, dict):
            for name, sub in value.items():
                if sub is False:
                    terms.append(("not", ("has", name)))
                elif not (sub is True or sub == {}):
                    return None
        elif key in _COMBINED and isinstance(value, list):
            branches = [presence(root, b, depth + 1) for b in value]
            if None in branches:
                return None
            terms.append((_COMBINED[key], tuple(branches)))
        elif key == "not":
            if (negated := presence(root, value, depth + 1)) is None:
                return None
            terms.append(("not", negated))
        elif key == "$ref" and isinstance(value, str):
            if (target := presence(root, pointer(root, value), depth + 1)) is None:
                return None
            terms.append(target)
        else:
            return None
    return terms[0] if len(terms) == 1 else ("all", tuple(terms))


def holds(f: Formula, keys: frozenset[str]) -> bool:
    if isinstance(f, bool):
        return f
    op, arg = f
    if op == "has":
        return arg in keys
    if op == "not":
        return not holds(arg, keys)
    if op == "all":
        return all(holds(g, keys) for g in arg)
    if op == "any":
        return any(holds(g, keys) for g in arg)
    return sum(holds(g, keys) for g in arg) == 1


def names(f: Formula) -> frozenset[str]:
    """The keys `f` speaks of."""
    if isinstance(f, bool):
        return frozenset()
    op, arg = f
    if op == "has":
        return frozenset({arg})
    if op == "not":
        return names(arg)
    return frozenset().union(*(names(g) for g in arg))


def satisfiable(f: Formula, keys: frozenset[str], pool: frozenset[str] | None) -> bool:
    """Some keys still allowed (`pool`; None: any) added to `keys` make `f` true (True where
    more than MAX_FREE of its keys are left open: not tried)."""
    free = sorted(names(f) - keys if pool is None else (names(f) & pool) - keys)
    if len(free) > MAX_FREE:
        return True
    return any(
        holds(f, keys | {k for k, on in zip(free, bits) if on})
        for bits in itertools.product((False, True), repeat=len(free))
    )


@functools.lru_cache(maxsize=4096)
def viable(f: Formula, keys: frozenset[str], pool: frozenset[str]) -> frozenset[str]:
    """The keys of `pool` after which some of the others can still make `f` true."""
    return frozenset(k for k in pool if satisfiable(f, keys | {k}, pool - {k}))
