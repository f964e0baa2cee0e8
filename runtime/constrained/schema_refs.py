"""Recursive `$ref`s where llguidance must intersect them, replaced by their target.

llguidance intersects a combinator's members with the keywords beside them (`properties` next
to `oneOf`, the members of an `allOf`) and refuses to do so for a `$ref` that lies on a cycle
("circular references with sibling keys"). A local `$ref` means its target, so putting one
copy of the target in its place accepts the same instances; the copy's own references stay
references, so the recursion itself is untouched. Targets that set a new base URI (`$id`,
draft-4 `id`) are left as references: their local refs would resolve elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .schema_logic import ASSERTIONS, DATA_KEYWORDS, pointer

_COMBINATORS = ("allOf", "anyOf", "oneOf")
MAX_GROWTH = 16  # a rewritten or unrolled schema may be at most this many times the original's size
MAX_NESTING = 4  # copies inside copies: a cycle through intersections alone stays a $ref


class TooLarge(Exception):
    """The copies would pass the size allowed (inline_cyclic_refs' max_chars)."""


def max_chars_of(schema: Any, text: str | None = None) -> int:
    """The most characters of JSON a schema may grow to (MAX_GROWTH times, and 4 kB more);
    `text`: its json.dumps, where the caller has it."""
    return MAX_GROWTH * len(json.dumps(schema) if text is None else text) + 4096


def inline_cyclic_refs(root: Any, max_chars: int) -> Any:
    """`root` with each intersected reference on a cycle replaced by a copy of its target.
    Raises TooLarge, before copying more, once the copies' JSON would pass max_chars
    characters: copies inside copies multiply (a 58 kB schema of the sample grew for 9 s).
    `root` itself where none is: the cycles are looked for from the intersected refs only."""
    cyclic = _cyclic_refs(root, _intersected_refs(root))
    if not cyclic:
        return root
    return _Inliner(root, cyclic, max_chars).walk(root)


class _Inliner:
    def __init__(self, root: Any, cyclic: set[str], max_chars: int) -> None:
        self.root, self.cyclic = root, cyclic
        self.chars_left = max_chars
        self.target_chars: dict[str, int] = {}  # each target's JSON length, measured once

    def walk(self, node: Any, nesting: int = 0) -> Any:
        """`node` with its intersected cyclic refs inlined; a copy is walked in turn."""
        if isinstance(node, list):
            return [self.walk(v, nesting) for v in node]
        if not isinstance(node, dict):
            return node
        out = {k: v if k in DATA_KEYWORDS else self.walk(v, nesting) for k, v in node.items()}
        for key in _COMBINATORS:
            members = out.get(key)
            if isinstance(members, list) and _intersected(out, key):
                out[key] = [self.inline(m, nesting) for m in members]
        return out

    def inline(self, member: Any, nesting: int) -> Any:
        if (ref := _whole_ref(member)) is None:
            return member
        target = pointer(self.root, ref)
        if ref not in self.cyclic or not isinstance(target, dict) or _new_base(target):
            return member
        if nesting >= MAX_NESTING:
            return member
        if ref not in self.target_chars:
            self.target_chars[ref] = len(json.dumps(target))
        self.chars_left -= self.target_chars[ref]
        if self.chars_left < 0:
            raise TooLarge(ref)
        # walk builds new containers, so the copy shares only DATA_KEYWORDS values (read only)
        return self.walk(target, nesting + 1)


def _whole_ref(member: Any) -> Any:
    """The `$ref` of a member that asserts nothing else; None for any other member."""
    if isinstance(member, dict) and set(member) & ASSERTIONS == {"$ref"}:
        return member["$ref"]
    return None


def _intersected_refs(root: Any) -> set[str]:
    """The local `$ref` values of the members of intersected combinators (those _Inliner may
    put a copy in place of), anywhere in `root`."""
    return _local_refs(root, _intersected_members)


def _intersected_members(node: dict[str, Any]) -> list[Any]:
    """The `$ref`s of `node`'s combinator members that assert nothing else, where llguidance
    intersects them."""
    return [
        _whole_ref(member)
        for key in _COMBINATORS
        if isinstance(node.get(key), list) and _intersected(node, key)
        for member in node[key]
    ]


def _local_refs(node: Any, refs_of: Callable[[dict[str, Any]], Any]) -> set[str]:
    """The local `$ref` values refs_of(subschema) names, over `node`'s subschemas."""
    out: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, list):
            stack += n
        elif isinstance(n, dict):
            out.update(r for r in refs_of(n) if isinstance(r, str) and r.startswith("#"))
            stack += _containers(n)
    return out


def _containers(node: dict[str, Any]) -> list[Any]:
    """The values of `node` a walk over subschemas goes into: its objects and lists, but
    those of DATA_KEYWORDS."""
    return [v for k, v in node.items() if isinstance(v, (dict, list)) and k not in DATA_KEYWORDS]


def _intersected(node: dict[str, Any], key: str) -> bool:
    """llguidance intersects `node[key]`'s members with something: each other (allOf), or
    other assertions beside the combinator."""
    others = any(k in ASSERTIONS and k != key for k in node)
    return others or (key == "allOf" and len(node[key]) > 1)


def _new_base(target: dict[str, Any]) -> bool:
    return isinstance(target.get("$id"), str) or isinstance(target.get("id"), str)


def _cyclic_refs(root: Any, refs: set[str]) -> set[str]:
    """Those of the local `$ref` values `refs` whose target can reach itself through more
    `$ref`s (the targets' refs are read only as far as `refs` reach)."""
    edges: dict[str, set[str]] = {}
    pending = sorted(refs)
    while pending:
        ref = pending.pop()
        if ref in edges:
            continue
        edges[ref] = _refs_in(pointer(root, ref))
        pending += [r for r in edges[ref] if r not in edges]
    return {ref for ref in refs if _reaches(edges, ref)}


def _reaches(edges: dict[str, set[str]], start: str) -> bool:
    seen: set[str] = set()
    stack = list(edges.get(start, ()))
    while stack:
        ref = stack.pop()
        if ref == start:
            return True
        if ref not in seen:
            seen.add(ref)
            stack += edges.get(ref, ())
    return False


def _refs_in(node: Any) -> set[str]:
    """Every local `$ref` value in `node`'s subschemas."""
    return _local_refs(node, lambda n: (n.get("$ref"),))


_BASE_KEYS = frozenset({"$schema", "$id", "id"})


def unrolled_root(root: Any, max_chars: int) -> dict[str, Any] | None:
    """`root` with its first level unrolled, where it refers to itself (`"$ref": "#"`): every
    such reference goes to a copy of the root among the definitions, and the root itself has
    a copy of each definition it refers to in place of the reference (a cycle back to one
    being copied stays a reference). The same instances pass; what the top level says then
    applies at its own instance paths only, so the keys it requires can be checked at them
    (property_order.py). None where the root does not refer to itself, a reference points
    into the root other than at its definitions, or the copies pass max_chars characters."""
    refs = _refs_in(root) if isinstance(root, dict) else set()
    if "#" not in refs:  # where it is there, it is on a cycle
        return None
    defs_key = "definitions" if isinstance(root.get("definitions"), dict) else "$defs"
    defs = root.get(defs_key, {})
    if not isinstance(defs, dict) or any(
        not ref.startswith((f"#/{defs_key}/", "#/definitions/", "#/$defs/")) and ref != "#"
        for ref in refs
    ):
        return None
    fresh = next(f"root{i}" for i in range(len(defs) + 1) if f"root{i}" not in defs)
    home = f"#/{defs_key}/{fresh}"
    redirected = _redirect(root, home)
    body = {k: v for k, v in redirected.items() if k not in _BASE_KEYS and k != defs_key}
    document = {**redirected, defs_key: {**redirected.get(defs_key, {}), fresh: body}}
    try:
        top = _Copier(document, max_chars).copy(body, frozenset({home}))
    except TooLarge:
        return None
    base = {k: v for k, v in redirected.items() if k in _BASE_KEYS}
    return {**base, **top, defs_key: document[defs_key]}


def _redirect(node: Any, home: str) -> Any:
    """`node` with each `"$ref": "#"` pointing at `home`."""
    if isinstance(node, list):
        return [_redirect(v, home) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: v if k in DATA_KEYWORDS else _redirect(v, home) for k, v in node.items()}
    if out.get("$ref") == "#":
        out["$ref"] = home
    return out


class _Copier:
    """Copies of subschemas with their local references replaced by copies of the targets,
    but on a cycle; raises TooLarge once the copies pass max_chars characters."""

    def __init__(self, document: Any, max_chars: int) -> None:
        self.document, self.chars_left = document, max_chars

    def copy(self, node: Any, within: frozenset[str]) -> Any:
        if isinstance(node, list):
            return [self.copy(v, within) for v in node]
        if not isinstance(node, dict):
            return node
        out = {k: v if k in DATA_KEYWORDS else self.copy(v, within) for k, v in node.items()}
        ref = out.get("$ref")
        target = pointer(self.document, ref) if isinstance(ref, str) else None
        if not isinstance(target, dict) or ref in within or _new_base(target):
            return out
        self.chars_left -= len(json.dumps(target))
        if self.chars_left < 0:
            raise TooLarge(ref)
        inlined = self.copy(target, within | {ref})
        rest = {k: v for k, v in out.items() if k != "$ref"}
        if not any(k in ASSERTIONS for k in rest):
            return inlined
        members = rest["allOf"] if isinstance(rest.get("allOf"), list) else []
        return {**rest, "allOf": [*members, inlined]}
