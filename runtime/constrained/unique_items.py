"""`uniqueItems` enforced beside the grammar: no grammar says "no two items equal", so the
llguidance schema leaves the keyword out and `BesideMatcher` refuses any token that would
complete an item equal (JSON equality) to an earlier item of the same array.

That is exact only where the keyword applies to every array at some instance path: a schema
reached from the root through `properties`, `patternProperties` (keys as ECMA-262 reads the
pattern; schema_logic.ecma_regex), `additionalProperties`, `items`, `prefixItems`, `allOf`
and local `$ref`s, or through an `anyOf` / `oneOf` branch that is the only one whose
instances can have the types the path needs there, down to the array itself
(`unique_arrays`). Under an `anyOf` with a branch that asserts nothing, every instance
passes: the keyword is left out there and enforced nowhere. A `uniqueItems` under `not`,
`if`, a pattern not read here or an ambiguous branch, or in a recursive schema, stays in the
schema, and the backend refuses it by name as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from .schema_logic import (
    ASSERTIONS,
    DATA_KEYWORDS,
    JSON_TYPES,
    SchemaLogic,
    as_list,
    ecma_regex,
    pointer,
)

# One step of an instance path: ("key", name), ("pattern", p) for any key the pattern p
# matches, ("other", (names, patterns)) for any key not in names and matched by none of the
# patterns, ("index", i), or ("item", start) for any index >= start.
Step = tuple[str, Any]
MAX_DEPTH = 32  # instance path steps followed from the root
MAX_VISITS = 20_000  # subschema visits (shared $refs are walked once per use)
MAX_CHAINS = 256  # disjunction chains merged for one subschema at one path
FREE = "free"  # the chain of a subschema under an anyOf that admits every instance anyway
MAX_HOPS = 64  # $refs, conjuncts, branches and steps followed to type a value inside a branch
# (depth, key, values): the object at the path's first `depth` steps has `key`, with one of
# these values (canonical(); None: any value); a path with its conditions (all must hold)
Condition = tuple[int, str, "frozenset[Any] | None"]
Placement = tuple[tuple[Step, ...], tuple[Condition, ...]]


@dataclass(frozen=True, slots=True)
class UniqueArrays:
    """Where `uniqueItems` is enforced beside the grammar."""

    node_ids: frozenset[int]  # id() of the schema's subschemas whose keyword is left out
    paths: tuple[tuple[Step, ...], ...]  # instance paths whose arrays must have unique items

    def applies(self, path: list[Any]) -> bool:
        return any(matches(p, path) for p in self.paths)


def unique_arrays(schema: Any) -> UniqueArrays:
    """The `uniqueItems: true` of `schema` that can be enforced exactly (see the module)."""
    exact = exact_nodes(schema, lambda s: s.get("uniqueItems") is True, "array")
    paths = sorted({path for _, placed in exact.values() for path, _ in placed}, key=repr)
    return UniqueArrays(frozenset(exact), tuple(paths))


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
    members: tuple[dict[str, Any], ...]  # allOf
    disjunctions: tuple[tuple[list[Any], bool], ...]  # anyOf / oneOf, and "admits every one"
    children: tuple[tuple[dict[str, Any], Step | None, bool], ...]  # (sub, step, opaque)


class _Walk(SchemaLogic):
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
        self.branches: dict[int, list[Any]] = {}  # each anyOf / oneOf passed, by id()
        self.holders: dict[int, dict[str, Any]] = {}  # the subschema each is a keyword of
        self.presence: dict[int, dict[int, str] | None] = {}  # by the list's id()
        # rules met on the way, (path, conditions, formula): "one of these keys is there"
        self.also: dict[tuple[tuple[Step, ...], tuple[Condition, ...], Any], None] = {}
        self.branch_types: dict[int, tuple[frozenset[str], ...]] = {}  # by the list's id()
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
            elif isinstance(target := pointer(self.root, shape.ref), dict):
                self.visit(target, path, chain, refs | {shape.ref})
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
        ref = s.get("$ref") if isinstance(s.get("$ref"), str) else None
        members = tuple(m for m in _list_of(s, "allOf") if isinstance(m, dict))
        disjunctions = []
        for key in () if self.aside(s) else ("anyOf", "oneOf"):
            if branches := _list_of(s, key):
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
        prefix, items = _list_of(s, "prefixItems"), s.get("items")
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
        shape = _Shape(self.wanted(s), ref, members, tuple(disjunctions), kept)
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

    def placed(
        self, path: tuple[Step, ...], chains: list[Any], kind: str, discriminate: bool
    ) -> list[tuple[Condition, ...]] | None:
        """The conditions under which a subschema reached by `chains` at `path` applies there
        (one set of them for each way it is reached; () for always), or None where that is
        not known (see `covered` and `conditions`)."""
        covered = self.covered(path, chains, kind)
        if any(self.conditions(path, chain, kind, False) == () for chain in covered):
            return [()]
        if not discriminate or not covered:
            return None
        decided = {c: self.conditions(path, c, kind, True) for c in covered}
        out: dict[tuple[Condition, ...], None] = {}
        for chain in chains:  # each way is decided by itself or by a chain it reduces to
            ways = [d for c, d in decided.items() if d is not None and _within(c, chain)]
            if not ways:
                return None
            out[min(ways, key=len)] = None
        return list(out)

    def conditions(
        self, path: tuple[Step, ...], chain: Any, kind: str, discriminate: bool
    ) -> tuple[Condition, ...] | None:
        """What chooses each branch passed: nothing where it is the only one whose instances
        can have the type the path needs there (an object before a key, an array before an
        index, `kind` at the end); else (`discriminate`) the value of a key that every
        instance there has, which that branch lists apart from every other one that could
        be taken, or the presence of a key that it requires and the others forbid
        (`presence_keys`). None where some branch is not chosen so."""
        if chain is None:
            return None
        out = []
        for where, types, taken, depth in chain:
            need = _needed(path, depth, kind)
            branches = self.branches[where]
            others = [
                j
                for j, t in enumerate(types)
                if j != taken and need in t and kind in self.types_at(branches[j], path[depth:], 0)
            ]
            if not others:
                continue
            if not discriminate or need != "object":
                return None
            if (found := self.discriminator(where, taken, others)) is not None:
                out.append((depth, *found))
            elif (keys := self.presence_keys(where)) is not None and taken in keys:
                # the object has one of these keys: a rule of its own, wherever the
                # disjunction applies (so under the conditions met on the way to it)
                some = ("any", tuple(("has", k) for k in keys.values()))
                self.also[(path[:depth], tuple(out), some)] = None
                out.append((depth, keys[taken], None))
            else:
                return None
        return tuple(out)

    def presence_keys(self, where: int) -> dict[int, str] | None:
        """For each branch of the disjunction that admits objects, a key it requires and
        every other one forbids (so an object takes the branch whose key it has, and has
        one); None where some branch has none."""
        if where in self.presence:
            return self.presence[where]
        branches, types = self.branches[where], self.branch_types[where]
        objects = {j: self.resolve(b, 0) for j, b in enumerate(branches) if "object" in types[j]}
        keys: dict[int, str] | None = {}
        for j, branch in objects.items():
            mine = [
                k
                for k in _required(branch)
                if all(_forbids(other, k) for i, other in objects.items() if i != j)
            ]
            if not mine or keys is None:
                keys = None
                break
            keys[j] = mine[0]
        self.presence[where] = keys
        return keys

    def discriminator(self, where: int, taken: int, others: list[int]) -> Any:
        """(key, values): a key every instance of the disjunction's object has (its holder,
        or each branch that could be taken, requires it), whose values under branch `taken`
        (const / enum) no branch of `others` allows; None if there is none."""
        branches, held = self.branches[where], as_list(self.holders[where].get("required"))
        resolved = self.resolve(branches[taken], 0)
        props = resolved.get("properties") if isinstance(resolved, dict) else None
        for key in props if isinstance(props, dict) else ():
            if (values := self.key_values(resolved, key)) is None:
                continue
            if key not in held and not all(
                key in _required(self.resolve(branches[j], 0)) for j in (taken, *others)
            ):
                continue
            mine = frozenset(canonical(v) for v in values)
            if all(
                (theirs := self.key_values(branches[j], key)) is not None
                and not mine & {canonical(v) for v in theirs}
                for j in others
            ):
                return key, mine
        return None

    def types_at(self, s: Any, steps: tuple[Step, ...], depth: int) -> frozenset[str]:
        """The JSON types the value at `steps` inside an instance of `s` may have (a
        superset; none where `s` admits no such value)."""
        if not steps:
            return self.types(s, 0)
        if s is False:
            return frozenset()
        if not isinstance(s, dict) or depth > MAX_HOPS:
            return JSON_TYPES
        kind, arg = steps[0]
        if _needed(steps, 0, "") not in self.types(s, 0):
            return frozenset()
        out = JSON_TYPES
        if isinstance(s.get("$ref"), str):
            out &= self.types_at(pointer(self.root, s["$ref"]), steps, depth + 1)
        for member in _list_of(s, "allOf"):
            out &= self.types_at(member, steps, depth + 1)
        for key in ("anyOf", "oneOf"):
            if branches := _list_of(s, key):
                out &= frozenset().union(*(self.types_at(b, steps, depth + 1) for b in branches))
        for sub in _subschemas_at(s, kind, arg):
            out &= self.types_at(sub, steps[1:], depth + 1)
        return out

    def covered(self, path: tuple[Step, ...], chains: list[Any], kind: str) -> set[Any]:
        """The chains a subschema is reached by at `path`, and each one less a disjunction
        passed where the others reach it through every branch an instance there could take
        (so the disjunction does not decide whether it applies). Empty where one of them
        passes a `not`, an `if` or the like (never exact)."""
        if None in chains:
            return set()
        out = set(chains)
        grown = True
        while grown and len(out) <= MAX_CHAINS:
            grown = False
            taken_by: dict[Any, set[int]] = {}
            for chain in out:
                for k, (where, types, taken, depth) in enumerate(chain):
                    key = (chain[:k], where, types, depth, chain[k + 1 :])
                    taken_by.setdefault(key, set()).add(taken)
            for (head, _, types, depth, tail), taken in taken_by.items():
                need = _needed(path, depth, kind)
                if all(j in taken for j, t in enumerate(types) if need in t):
                    grown |= (*head, *tail) not in out
                    out.add((*head, *tail))
        return out


def _required(s: Any) -> list[Any]:
    return as_list(s.get("required")) if isinstance(s, dict) else []


def _forbids(s: Any, key: str) -> bool:
    """No instance of `s` has `key` (a property that is false, or a closed object without
    patterns that does not list it)."""
    if not isinstance(s, dict):
        return s is False
    props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
    closed = s.get("additionalProperties") is False and not s.get("patternProperties")
    return props.get(key) is False or (closed and key not in props)


def _within(reduced: tuple[Any, ...], chain: tuple[Any, ...]) -> bool:
    """`reduced` is `chain` less some of its links (in order)."""
    links = iter(chain)
    return all(link in links for link in reduced)


def _needed(path: tuple[Step, ...], depth: int, kind: str) -> str:
    """The type an instance at `path`'s first `depth` steps has for the path to go on."""
    if depth == len(path):
        return kind
    return "array" if path[depth][0] in ("index", "item") else "object"


_OPAQUE = frozenset(
    "not if then else contains propertyNames unevaluatedItems unevaluatedProperties".split()
)
_OPAQUE_MAPS = frozenset({"dependencies", "dependentSchemas"})


def _opaque(chain: Any) -> Any:
    """The chain under a keyword where a subschema is never exact (`not`, `if`, ...)."""
    return FREE if chain is FREE else None


def _asserts_nothing(s: Any) -> bool:
    return s is True or isinstance(s, dict) and not any(k in ASSERTIONS for k in s)


def _subschemas_at(s: dict[str, Any], kind: str, arg: Any) -> list[Any]:
    """The subschemas of `s` that the value one step (`kind`, `arg`) inside applies (those
    that a step standing for many keys or indices may pass under: none)."""
    if kind == "key":
        props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
        patterns = s.get("patternProperties")
        patterns = patterns if isinstance(patterns, dict) else {}
        if any(ecma_regex(p) is None for p in patterns):
            return []
        out = [sub for p, sub in patterns.items() if _searches(p, arg)]
        if arg in props:
            return [props[arg], *out]
        return out or [s.get("additionalProperties", True)]
    if kind in ("index", "item"):
        prefix = _list_of(s, "prefixItems") or _list_of(s, "items")
        if arg < len(prefix):
            return [prefix[arg]] if kind == "index" else []
        return [s.get("additionalItems" if isinstance(s.get("items"), list) else "items", True)]
    return []


def _list_of(s: dict[str, Any], key: str) -> list[Any]:
    return s[key] if isinstance(s.get(key), list) else []


def matches(pattern: tuple[Step, ...], path: list[Any]) -> bool:
    if len(pattern) != len(path):
        return False
    for (kind, arg), at in zip(pattern, path):
        is_key = isinstance(at, str)
        if kind == "key" and not (is_key and at == arg):
            return False
        if kind == "pattern" and not (is_key and _searches(arg, at)):
            return False
        if kind == "other" and not (
            is_key and at not in arg[0] and not any(_searches(p, at) for p in arg[1])
        ):
            return False
        if kind == "index" and not (not is_key and at == arg):
            return False
        if kind == "item" and not (not is_key and at >= arg):
            return False
    return True


def _searches(pattern: str, key: str) -> bool:
    """The key matches the `patternProperties` pattern (read as ECMA-262 reads it)."""
    compiled = ecma_regex(pattern)
    return compiled is not None and compiled.search(key) is not None


def canonical(value: Any) -> Any:
    """A hashable form equal exactly where JSON Schema calls two values equal (1 == 1.0,
    true != 1, objects regardless of key order)."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, (int, float)):
        return ("number", int(value) if float(value).is_integer() else value)
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, list):
        return ("array", tuple(canonical(v) for v in value))
    return ("object", frozenset((k, canonical(v)) for k, v in value.items()))
