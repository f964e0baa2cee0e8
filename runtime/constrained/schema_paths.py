"""Which subschemas apply at which instance paths, exactly: the walk that places a keyword
beside the grammar (`uniqueItems`, unique_items.py; an object's key rules, property_order.py)
only where it holds for every instance at some path, or under conditions on the keys or
values of the objects on the way (a discriminated `anyOf`, branch_choice.py).

A subschema is reached from the root through `properties`, `patternProperties` (keys as
ECMA-262 reads the pattern; ecma_regex.py), `additionalProperties`, `items`,
`prefixItems`, `allOf`, local `$ref`s and `anyOf` / `oneOf` branches. Under `not`, `if`, a
pattern not read here, an ambiguous branch or a recursive `$ref`'s target it is never exact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from .branch_choice import BranchChoice
from .ecma_regex import ecma_regex
from .instance_paths import Condition, Placement, Step, list_of
from .schema_logic import ASSERTIONS, DATA_KEYWORDS, pointer

MAX_DEPTH = 32  # instance path steps followed from the root
MAX_VISITS = 20_000  # subschema visits (shared $refs are walked once per use)
FREE = "free"  # the chain of a subschema under an anyOf that admits every instance anyway


def exact_nodes(
    schema: Any,
    wanted: Callable[[dict[str, Any]], bool],
    kind: str,
    discriminate: bool = False,
    aside: Callable[[dict[str, Any]], bool] | None = None,
    also: list[tuple[tuple[Step, ...], tuple[Condition, ...], Any]] | None = None,
) -> dict[int, tuple[dict[str, Any], list[Placement]]]:
    """The subschemas `wanted` picks that apply to every instance of type `kind` at each
    instance path they are reached at (by id(): the subschema and those paths); none where
    the walk is cut (too deep, too many visits), and none of those a recursive $ref reaches
    (the target of a $ref met again inside itself, and all under it: they apply at paths
    without end); the rest of a recursive schema is exact as in any other. A subschema reached
    through every branch of an `anyOf` / `oneOf` that an instance could take there (the same
    definition under each of them) applies whichever branch it takes; one reached only under
    an `anyOf` that admits every instance anyway is found with no paths (nothing to enforce).
    Each path comes with the conditions it applies under: none, or (`discriminate`) the
    discriminator values that choose each branch passed where another could also be taken
    (`_Walk.conditions`). The `anyOf` / `oneOf` of a subschema `aside` picks are not walked
    (a caller that enforces them otherwise where that subschema is exact). Where a branch is
    chosen by which key the object has, `also` receives the rule that one of the branches'
    keys is there: (path, conditions, key_presence.py formula)."""
    if not isinstance(schema, dict):
        return {}
    walk = _Walk(schema, wanted, aside or (lambda _: False))
    walk.visit(schema, (), (), frozenset())
    if walk.cut:
        return {}
    recursive = walk.recursive_nodes()
    found = {}
    for node_id, visits in walk.found.items():
        if node_id in recursive:
            continue
        by_path: dict[tuple[Step, ...], list[Any]] = {}
        for path, chain in visits:
            if chain is not FREE:  # where it asserts nothing, it needs no enforcing
                by_path.setdefault(path, []).append(chain)
        placements = []
        for path, chains in by_path.items():
            if (placed := walk.placed(path, chains, kind, discriminate)) is None:
                break
            placements += [(path, conditions) for conditions in placed]
        else:
            found[node_id] = (walk.nodes[node_id], placements)
    if also is not None:
        also.extend(walk.also)
    return found


class _Shape(NamedTuple):
    """A subschema's keywords as a walk follows them."""

    wanted: bool
    ref: str | None
    target: Any  # what `ref` points to
    members: tuple[dict[str, Any], ...]  # allOf
    disjunctions: tuple[tuple[list[Any], bool], ...]  # anyOf / oneOf, and "admits every one"
    children: tuple[tuple[dict[str, Any], Step | None, bool], ...]  # (sub, step, opaque)


class _Walk(BranchChoice):
    """Every subschema `wanted` picks (by id()), with the instance paths it applies at and
    the disjunctions passed on the way (branch types, branch taken, path depth); a chain of
    None marks one reached under `not`, `if`, a pattern and the like: never exact."""

    def __init__(
        self,
        root: Any,
        wanted: Callable[[dict[str, Any]], bool],
        aside: Callable[[dict[str, Any]], bool],
    ) -> None:
        super().__init__(root)
        self.wanted, self.aside = wanted, aside
        self.found: dict[int, list[tuple[tuple[Step, ...], Any]]] = {}
        self.nodes: dict[int, dict[str, Any]] = {}
        self.cut = False  # a path past MAX_DEPTH, too many visits
        self.num_visits = 0
        self.recursive_refs: set[str] = set()  # $refs met again inside their own target
        self.shapes: dict[int, _Shape] = {}

    def visit(self, s: Any, path: tuple[Step, ...], chain: Any, refs: frozenset[str]) -> None:
        self.num_visits += 1
        if len(path) > MAX_DEPTH or self.num_visits > MAX_VISITS:
            self.cut = True
            return
        shape = self.shapes.get(id(s)) or self.shape(s)
        if shape.wanted:
            self.found.setdefault(id(s), []).append((path, chain))
            self.nodes[id(s)] = s
        if shape.ref is not None:
            if shape.ref in refs:
                self.recursive_refs.add(shape.ref)
            elif isinstance(shape.target, dict):
                self.visit(shape.target, path, chain, refs | {shape.ref})
        for member in shape.members:
            self.visit(member, path, chain, refs)
        for branches, admits_all in shape.disjunctions:
            if chain is FREE or admits_all:
                for b in branches:  # it admits every instance, whatever the others say
                    if isinstance(b, dict):
                        self.visit(b, path, FREE, refs)
                continue
            if (types := self.branch_types.get(id(branches))) is None:
                types = self.branch_types[id(branches)] = tuple(self.types(b, 0) for b in branches)
                self.branches[id(branches)] = branches
                self.holders[id(branches)] = s
            for i, b in enumerate(branches):
                if isinstance(b, dict):
                    link = None if chain is None else (*chain, (id(branches), types, i, len(path)))
                    self.visit(b, path, link, refs)
        for sub, step, opaque in shape.children:
            inner = path if step is None else (*path, step)
            self.visit(sub, inner, _opaque(chain) if opaque else chain, refs)

    def shape(self, s: dict[str, Any]) -> _Shape:
        """What a visit of `s` follows (kept by id(): a shared definition is visited once per
        use, its keywords read once)."""
        if s.keys().isdisjoint(_FOLLOWED):  # a leaf: nothing under it to walk
            shape = self.shapes[id(s)] = _Shape(self.wanted(s), None, None, (), (), ())
            return shape
        ref = s.get("$ref") if isinstance(s.get("$ref"), str) else None
        members = tuple(m for m in list_of(s, "allOf") if isinstance(m, dict))
        disjunctions = []
        for key in () if self.aside(s) else ("anyOf", "oneOf"):
            if branches := list_of(s, key):
                admits_all = key == "anyOf" and any(_asserts_nothing(b) for b in branches)
                disjunctions.append((branches, admits_all))
        children: list[tuple[Any, Step | None, bool]] = []
        props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
        children += [(sub, ("key", name), False) for name, sub in props.items()]
        patterns = (
            s.get("patternProperties") if isinstance(s.get("patternProperties"), dict) else {}
        )
        unread = not all(ecma_regex(p) is not None for p in patterns)  # never exact under them
        children += [(sub, ("pattern", p), unread) for p, sub in patterns.items()]
        other = ("other", (frozenset(props), tuple(patterns)))
        children.append((s.get("additionalProperties"), other, unread))
        prefix, items = list_of(s, "prefixItems"), s.get("items")
        if isinstance(items, list):  # drafts 4-7: a tuple, then additionalItems
            prefix = items
            children.append((s.get("additionalItems"), ("item", len(items)), False))
        else:
            children.append((items, ("item", len(prefix)), False))
        children += [(sub, ("index", i), False) for i, sub in enumerate(prefix)]
        for key, value in s.items():  # everywhere else the keyword is never exact
            if key in _OPAQUE:
                children.append((value, None, True))
            elif key in _OPAQUE_MAPS and isinstance(value, dict):
                children += [(sub, None, True) for sub in value.values()]
        kept = tuple((sub, step, opaque) for sub, step, opaque in children if isinstance(sub, dict))
        target = None if ref is None else pointer(self.root, ref)
        shape = _Shape(self.wanted(s), ref, target, members, tuple(disjunctions), kept)
        self.shapes[id(s)] = shape
        return shape

    def recursive_nodes(self) -> set[int]:
        """The ids of every subschema under a recursive $ref's target (following $refs and
        every keyword but the data ones)."""
        seen: set[int] = set()
        stack = [pointer(self.root, ref) for ref in self.recursive_refs]
        while stack:
            node = stack.pop()
            if isinstance(node, list):
                stack.extend(node)
            elif isinstance(node, dict) and id(node) not in seen:
                seen.add(id(node))
                if isinstance(node.get("$ref"), str):
                    stack.append(pointer(self.root, node["$ref"]))
                stack.extend(v for k, v in node.items() if k not in DATA_KEYWORDS)
        return seen


_OPAQUE = frozenset(
    "not if then else contains propertyNames unevaluatedItems unevaluatedProperties".split()
)
_OPAQUE_MAPS = frozenset({"dependencies", "dependentSchemas"})
# Every keyword a visit follows (shape): a subschema with none of them is a leaf.
_FOLLOWED = (
    frozenset(
        "$ref allOf anyOf oneOf properties patternProperties additionalProperties items "
        "prefixItems additionalItems".split()
    )
    | _OPAQUE
    | _OPAQUE_MAPS
)


def _opaque(chain: Any) -> Any:
    """The chain under a keyword where a subschema is never exact (`not`, `if`, ...)."""
    return FREE if chain is FREE else None


def _asserts_nothing(s: Any) -> bool:
    return s is True or isinstance(s, dict) and not any(k in ASSERTIONS for k in s)
