"""A subschema whose instances come from a finite list (its own `enum` / `const`, or an `allOf`
member's) is exactly the enum of the listed values that pass all of it, so a `not`, `oneOf`,
`if` or `uniqueItems` beside such a list needs no rewrite of its own.

Whether a value passes is decided by `jsonschema` against the subschema as written, its local
`$ref`s resolved in the whole document: under the validator its `$schema` names, or, without
one, under Draft 7 and 2020-12 both, folding only where they agree on every value (so a keyword
that one draft ignores, such as `dependencies` or `prefixItems`, never decides a value alone).
"""

from __future__ import annotations

from typing import Any

from .schema_logic import ASSERTIONS, SchemaLogic

MAX_VALUES = 256  # listed values checked per subschema; a longer list is not folded


class FiniteFolder:
    """Folds subschemas of one document (`root`) to the listed values that pass them."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.logic = SchemaLogic(root)
        self._validators: list[Any] | None = None

    def fold(self, original: Any, keep: dict[str, Any]) -> dict[str, Any] | None:
        """`keep` (the subschema's annotations, `$defs` and the like) with `enum` set to the
        listed values of `original` that pass it; None where nothing is listed, the list is
        too long, or the validators disagree or cannot read the document."""
        values = self.listed(original)
        if values is None or len(values) > MAX_VALUES:
            return None
        validators = self.validators()
        if not validators:
            return None
        passing = []
        for value in values:
            verdicts = {self._is_valid(v, original, value) for v in validators}
            if len(verdicts) != 1 or None in verdicts:
                return None
            if verdicts.pop():
                passing.append(value)
        return {**keep, "enum": passing}

    def listed(self, s: Any) -> list[Any] | None:
        """The finite list `s`'s instances come from: its own enum / const, else an allOf
        member's (followed through local `$ref`s)."""
        if not isinstance(s, dict):
            return None
        if "const" in s:
            return [s["const"]]
        if isinstance(s.get("enum"), list):
            return s["enum"]
        for member in s.get("allOf", []) if isinstance(s.get("allOf"), list) else []:
            resolved = self.logic.resolve(member, 0)
            if isinstance(resolved, dict) and (
                "const" in resolved or isinstance(resolved.get("enum"), list)
            ):
                return [resolved["const"]] if "const" in resolved else resolved["enum"]
        return None

    def validators(self) -> list[Any]:
        if self._validators is None:
            self._validators = _validators(self.root)
        return self._validators

    @staticmethod
    def _is_valid(validator: Any, schema: Any, value: Any) -> bool | None:
        from jsonschema.exceptions import UnknownType
        from referencing.exceptions import Unresolvable

        try:
            return bool(validator.evolve(schema=schema).is_valid(value))
        except (UnknownType, Unresolvable, RecursionError):  # undecided: the caller keeps `not`
            return None


def _validators(root: Any) -> list[Any]:
    """The validators that decide for `root`: its `$schema`'s, else Draft 7 and 2020-12; a
    draft whose metaschema `root` does not pass is left out."""
    from jsonschema import Draft7Validator, Draft202012Validator, validators
    from jsonschema.exceptions import SchemaError

    if not isinstance(root, dict):
        return []
    if "$schema" in root:
        named = validators.validator_for(root, default=None)
        classes = [named] if named is not None else []
    else:
        classes = [Draft7Validator, Draft202012Validator]
    out = []
    for cls in classes:
        try:
            cls.check_schema(root)
        except (SchemaError, RecursionError):
            continue
        out.append(cls(root, format_checker=cls.FORMAT_CHECKER))
    return out if len(out) == len(classes) else []


def annotations(s: dict[str, Any]) -> dict[str, Any]:
    """The keys of `s` that never fail an instance (titles, `$defs`, `$schema`, ...)."""
    return {k: v for k, v in s.items() if k not in ASSERTIONS}
