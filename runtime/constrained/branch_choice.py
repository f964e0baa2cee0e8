"""Which branch of an `anyOf` / `oneOf` an instance takes at a path, as schema_paths.py's walk
asks it: the only branch whose instances can have the type the path needs there, or the one a
discriminator chooses (a key every object there has, whose `const` / `enum` values the branch
lists apart from the others; or a key the branch requires and the others forbid, with the
rule that one such key is there). A subschema reached through every branch an instance could
take applies whichever it takes.
"""

from __future__ import annotations

from typing import Any

from .instance_paths import Condition, Step, canonical, list_of, needed, subschemas_at
from .schema_logic import JSON_TYPES, SchemaLogic, as_list, forbids, pointer

MAX_CHAINS = 256  # disjunction chains merged for one subschema at one path
MAX_HOPS = 64  # $refs, conjuncts, branches and steps followed to type a value inside a branch


class BranchChoice(SchemaLogic):
    """The disjunctions a walk passes (by the branch list's id()), and what chooses a branch."""

    def __init__(self, root: Any) -> None:
        super().__init__(root)
        self.branches: dict[int, list[Any]] = {}  # each anyOf / oneOf passed, by id()
        self.holders: dict[int, dict[str, Any]] = {}  # the subschema each is a keyword of
        self.branch_types: dict[int, tuple[frozenset[str], ...]] = {}  # by the list's id()
        self.presence: dict[int, dict[int, str] | None] = {}  # by the list's id()
        # rules met on the way, (path, conditions, formula): "one of these keys is there"
        self.also: dict[tuple[tuple[Step, ...], tuple[Condition, ...], Any], None] = {}
        self._branch_types_at: dict[tuple[int, tuple[Step, ...]], frozenset[str]] = {}

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
            need = needed(path, depth, kind)
            branches = self.branches[where]
            others = [
                j
                for j, t in enumerate(types)
                if j != taken
                and need in t
                and kind in self.branch_types_at(branches[j], path[depth:])
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
                if all(forbids(other, k) for i, other in objects.items() if i != j)
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

    def branch_types_at(self, branch: Any, steps: tuple[Step, ...]) -> frozenset[str]:
        """types_at from a branch, kept by (id(), steps): every chain through a disjunction
        asks it again of the branches it did not take."""
        key = (id(branch), steps)
        if (found := self._branch_types_at.get(key)) is None:
            found = self._branch_types_at[key] = self.types_at(branch, steps, 0)
        return found

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
        if needed(steps, 0, "") not in self.types(s, 0):
            return frozenset()
        out = JSON_TYPES
        if isinstance(s.get("$ref"), str):
            out &= self.types_at(pointer(self.root, s["$ref"]), steps, depth + 1)
        for member in list_of(s, "allOf"):
            out &= self.types_at(member, steps, depth + 1)
        for key in ("anyOf", "oneOf"):
            if branches := list_of(s, key):
                out &= frozenset().union(*(self.types_at(b, steps, depth + 1) for b in branches))
        for sub in subschemas_at(s, kind, arg):
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
                need = needed(path, depth, kind)
                if all(j in taken for j, t in enumerate(types) if need in t):
                    grown |= (*head, *tail) not in out
                    out.add((*head, *tail))
        return out


def _required(s: Any) -> list[Any]:
    return as_list(s.get("required")) if isinstance(s, dict) else []


def _within(reduced: tuple[Any, ...], chain: tuple[Any, ...]) -> bool:
    """`reduced` is `chain` less some of its links (in order)."""
    links = iter(chain)
    return all(link in links for link in reduced)
