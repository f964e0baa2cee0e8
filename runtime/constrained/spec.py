"""A request's output constraint, reduced to one validated regex in outlines-core's dialect.

Front doors: `regex`, `json_schema` (dict, JSON string or pydantic model class), `choices`,
`dtype`, `ebnf` (a GBNF / Lark grammar: the llguidance backend only). Anything outlines-core
would reject opaquely or silently mis-handle is reported by name up front: unsupported regex
features always raise ValueError (regex_check.py); JSON-schema keywords that outlines-core
ignores (schema_check.py) raise too when `strict` (the default), or become warnings otherwise.
The dtype regexes and schema serialization come from lang.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from ...lang.constraints import DTYPE_REGEX as _REGEX_BY_TYPE
from ...lang.constraints import choices_regex, schema_to_json
from .property_order import check_property_order
from .regex_check import normalize_regex
from .schema_check import rewrite_formats, schema_issues

DTYPE_REGEX = {t.__name__: regex for t, regex in _REGEX_BY_TYPE.items()}


@dataclass(slots=True, frozen=True)
class ConstraintSpec:
    """Exactly one constraint, normalized so equal constraints have equal keys."""

    regex: str | None = None
    json_schema: str | None = None  # a JSON document; dicts / pydantic models are serialized
    choices: tuple[str, ...] | None = None
    dtype: str | None = None  # "int" | "float" | "bool" | "str"
    whitespace: str | None = None  # JSON whitespace pattern; None = compact (no whitespace)
    strict: bool = True  # False: ignored schema keywords become warnings instead of errors
    ebnf: str | None = None  # GBNF (llama.cpp's dialect, as SGLang takes it) or Lark
    # "schema": object keys in the schema's order; "any": in any order (property_order.py)
    property_order: str = "schema"

    def __post_init__(self) -> None:
        names = ("regex", "json_schema", "choices", "dtype", "ebnf")
        given = [n for n in names if getattr(self, n)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {'/'.join(names)}, got {given}")
        if check_property_order(self.property_order) != "schema" and self.json_schema is None:
            raise ValueError(
                f"property_order {self.property_order!r} applies to a json_schema only, got "
                f"a {given[0]}"
            )
        if self.dtype is not None and self.dtype not in DTYPE_REGEX:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_REGEX)}, got {self.dtype!r}")

    @classmethod
    def create(
        cls,
        regex: str | None = None,
        json_schema: Any = None,
        choices: Any = None,
        dtype: Any = None,
        whitespace: str | None = None,
        strict: bool = True,
        ebnf: str | None = None,
        property_order: str = "schema",
    ) -> ConstraintSpec:
        """Normalize the front-door arguments (schema objects to JSON, types to dtype names)."""
        if choices is not None:
            if isinstance(choices, str) or not all(isinstance(c, str) for c in choices):
                raise TypeError(f"choices must be a list of str, got {choices!r}")
            choices = tuple(choices)
        if isinstance(dtype, type):
            dtype = dtype.__name__
        schema = None if json_schema is None else schema_to_json(json_schema)
        return cls(regex, schema, choices, dtype, whitespace, strict, ebnf, property_order)

    @property
    def key(self) -> str:
        fields = [self.regex, self.json_schema, self.choices, self.dtype, self.whitespace]
        order = [] if self.property_order == "schema" else [self.property_order]  # keys as before
        blob = json.dumps([*fields, self.strict, self.ebnf, *order], ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]


class IgnoredKeywords(ValueError):
    """A schema holds keywords outlines-core would drop: another backend may honour them."""


@dataclass(slots=True)
class ResolvedConstraint:
    """The regex to compile, and what was loosened to get it (only when not strict)."""

    regex: str
    warnings: list[str] = field(default_factory=list)


def resolve(spec: ConstraintSpec) -> ResolvedConstraint:
    """The validated regex for `spec`; ValueError names whatever cannot be honoured."""
    if spec.regex is not None:
        return ResolvedConstraint(normalize_regex(spec.regex))
    if spec.choices is not None:
        return ResolvedConstraint(choices_regex(spec.choices))
    if spec.dtype is not None:
        return ResolvedConstraint(DTYPE_REGEX[spec.dtype])
    if spec.property_order != "schema":
        raise ValueError(
            f"property_order {spec.property_order!r} needs the llguidance grammar backend "
            "(sampling_params.grammar_backend or --grammar-backend llguidance); the outlines "
            "backend emits properties in the schema's order"
        )
    if spec.ebnf is not None:
        raise ValueError(
            "ebnf grammars need the llguidance grammar backend (sampling_params.grammar_backend "
            "or --grammar-backend llguidance); the outlines backend takes regex and json_schema"
        )
    from outlines_core.json_schema import build_regex_from_schema

    assert spec.json_schema is not None
    schema = rewrite_formats(json.loads(spec.json_schema))
    issues = schema_issues(schema)
    if issues and spec.strict:
        raise IgnoredKeywords(
            "json_schema keywords the outlines grammar backend would silently ignore (the "
            "llguidance backend honours them: grammar_backend llguidance; strict=False accepts "
            "the looser constraint): " + "; ".join(issues)
        )
    whitespace = "" if spec.whitespace is None else spec.whitespace
    try:
        regex = build_regex_from_schema(json.dumps(schema, ensure_ascii=False), whitespace)
    except ValueError as err:
        raise ValueError(
            f"json_schema not supported by the outlines grammar backend: {err} (the llguidance "
            "backend may take it: grammar_backend llguidance)"
        ) from err
    return ResolvedConstraint(normalize_regex(regex), [f"ignored: {i}" for i in issues])


def constraint_regex(
    regex: str | None = None,
    json_schema: Any = None,
    choices: Any = None,
    dtype: Any = None,
    whitespace: str | None = None,
) -> str:
    """The regex a request with this constraint is decoded under (strict validation)."""
    spec = ConstraintSpec.create(regex, json_schema, choices, dtype, whitespace)
    return resolve(spec).regex
