"""`uniqueItems` enforced beside the grammar: no grammar says "no two items equal", so the
llguidance schema leaves the keyword out and `BesideMatcher` refuses any token that would
complete an item equal (JSON equality) to an earlier item of the same array.

That is exact only where the keyword applies to every array at some instance path
(schema_paths.py's walk, without conditions: `unique_arrays`). Under an `anyOf` with a branch
that asserts nothing, every instance passes: the keyword is left out there and enforced
nowhere. A `uniqueItems` under `not`, `if`, a pattern not read here or an ambiguous branch,
or in a recursive schema, stays in the schema, and the backend refuses it by name as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .instance_paths import Step, matches
from .schema_paths import exact_nodes


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
