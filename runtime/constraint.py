"""`stemma.Constraint`: a compiled output constraint over a model's tokenizer, usable without
an engine: check whether a text or token sequence is a complete match, or walk it token by
token. Compiled by the same backends and services the engine uses (runtime/constrained/
backend.py), with the same limits; one service per (model, backend, time limit) is kept.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from .config import EngineConfig
from .constrained.backend import (
    GrammarBackend,
    GrammarMatcher,
    check_backend,
    check_spec,
    compile_checks_spec,
    create_backend,
)
from .constrained.spec import ConstraintSpec
from .constrained.vocabulary import CompileLimits
from .tokenizer import Tokenizer

# One default for the engine and stemma.Constraint: EngineConfig.grammar_backend.
DEFAULT_GRAMMAR_BACKEND: str = EngineConfig.__dataclass_fields__["grammar_backend"].default
_services: dict[tuple[str, str, float], tuple[Tokenizer, GrammarBackend]] = {}
_services_lock = threading.Lock()


def _service(model: str, backend: str, timeout_s: float) -> tuple[Tokenizer, GrammarBackend]:
    key = (model, backend, timeout_s)
    with _services_lock:
        if key not in _services:
            from .models.loader import resolve_checkpoint

            tokenizer = Tokenizer(resolve_checkpoint(model))
            limits = CompileLimits(timeout_s=timeout_s)
            _services[key] = (tokenizer, create_backend(backend, tokenizer, limits=limits))
        return _services[key]


@dataclass(slots=True)
class ConstraintMatcher:
    """One walk through a constraint: `allows`, `accept`, `is_final`, token by token."""

    inner: GrammarMatcher

    def allows(self, token_id: int) -> bool:
        return self.inner.allows(token_id)

    def accept(self, token_id: int) -> bool:
        """Advance over `token_id` if allowed; False (and no change) if not."""
        if not self.inner.allows(token_id):
            return False
        self.inner.accept_token(token_id)
        return True

    def is_final(self) -> bool:
        """The tokens so far are a complete match."""
        return self.inner.is_final()

    def is_finished(self) -> bool:
        """Nothing but the end can follow."""
        return self.inner.is_finished()

    def rollback(self, num_tokens: int) -> None:
        self.inner.rollback(num_tokens)


class Constraint:
    """Exactly one of json_schema (dict, JSON text or pydantic model), regex, choices or ebnf
    (a GBNF or Lark grammar).

    ValueError names what the backend cannot honour (a keyword and its schema path), or the
    limit a compile ran past. backend: "outlines" | "llguidance" (None: the default; an ebnf
    grammar, or property_order "any", defaults to llguidance, the backend that takes it).
    property_order: "schema" (an object's properties in the schema's order) or "any" (in any
    order, each at most once; constrained/property_order.py)."""

    def __init__(
        self,
        json_schema: Any = None,
        regex: str | None = None,
        choices: list[str] | None = None,
        *,
        ebnf: str | None = None,
        model: str = "smollm2-135m",
        backend: str | None = None,
        strict: bool = True,
        timeout_s: float = 20.0,
        property_order: str = "schema",
    ) -> None:
        self.spec = ConstraintSpec.create(
            regex=regex,
            json_schema=json_schema,
            choices=choices,
            strict=strict,
            ebnf=ebnf,
            property_order=property_order,
        )
        needs_llguidance = ebnf is not None or property_order != "schema"
        default = "llguidance" if needs_llguidance else DEFAULT_GRAMMAR_BACKEND
        self.backend = check_backend(backend or default)
        self.tokenizer, service = _service(model, self.backend, timeout_s)
        if not compile_checks_spec(self.backend):
            check_spec(self.backend, self.spec)
        handle = service.submit(self.spec)
        handle.wait()
        if handle.error is not None:
            raise ValueError(handle.error)
        self._handle = handle
        self.warnings = list(handle.warnings)

    def matcher(self) -> ConstraintMatcher:
        """A fresh walk from the start."""
        return ConstraintMatcher(self._handle.matcher())

    def accepts(self, text_or_token_ids: str | list[int]) -> bool:
        """Whether the text (tokenized as the model would) or the ids is a complete match."""
        ids = text_or_token_ids
        if isinstance(ids, str):
            ids = self.tokenizer.encode(ids)
        m = self.matcher()
        return all(m.accept(t) for t in ids) and m.is_final()
