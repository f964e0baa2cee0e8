"""One grammar-backend interface (SGLang's BaseGrammarBackend idea), two backends behind it.

A backend is a service with `submit(spec) -> handle` (never blocks: compiles off the scheduler
thread under limits, a failure fails only its request) and `close()`; a handle has `ready()`,
`wait()`, `error`, `warnings` and `matcher()`, a fresh GrammarMatcher per request. Everything
the scheduler does with a constraint goes through GrammarMatcher: one bitmask per request per
step, forced tokens for jump-forward (drafts still verified by the model), rollback.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..config import GRAMMAR_BACKENDS
from ..faults import Faults
from .spec import IgnoredKeywords
from .vocabulary import CompileLimits

if TYPE_CHECKING:
    from ..tokenizer import Tokenizer
    from .spec import ConstraintSpec


class GrammarMatcher(Protocol):
    """One request's position in a compiled constraint."""

    is_terminated: bool  # EOS accepted
    num_accepted: int

    @property
    def error(self) -> str | None: ...
    def allows(self, token_id: int) -> bool: ...
    def accept_token(self, token_id: int) -> None: ...
    def rollback(self, num_tokens: int) -> None: ...
    def is_final(self) -> bool: ...
    def is_finished(self) -> bool: ...
    def fill_mask(self, bitmask: Any, row: int | None = None) -> None: ...
    def jump_forward(
        self, tokenizer: Tokenizer, *, stop_before_merge: bool = True
    ) -> list[int]: ...


class GrammarHandleLike(Protocol):
    spec: ConstraintSpec
    error: str | None
    warnings: list[str]

    def ready(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> bool: ...
    def matcher(self) -> GrammarMatcher: ...


class GrammarBackend(Protocol):
    def submit(self, spec: ConstraintSpec | str) -> GrammarHandleLike: ...
    def close(self) -> None: ...


def check_backend(name: str) -> str:
    if name not in GRAMMAR_BACKENDS:
        raise ValueError(f"grammar_backend must be one of {GRAMMAR_BACKENDS}, got {name!r}")
    return name


def create_backend(
    name: str,
    tokenizer: Tokenizer,
    *,
    cache_dir: Path | None = None,
    limits: CompileLimits | None = None,
    faults: Faults | None = None,
) -> GrammarBackend:
    """The named backend's service over `tokenizer` (builds its vocabulary: about a second)."""
    if check_backend(name) == "llguidance":
        from .llguidance_backend import LLGuidanceService

        return LLGuidanceService(tokenizer, limits, faults=faults)
    from .service import GrammarService
    from .vocabulary import Vocabulary

    vocab = Vocabulary.from_tokenizer(tokenizer)
    return GrammarService(vocab, cache_dir=cache_dir, limits=limits, faults=faults)


def check_spec(name: str, spec: ConstraintSpec) -> None:
    """Up-front validation at the request boundary: ValueError names what cannot be honoured.

    outlines: the regex the schema resolves to (unsupported features and keywords, by name).
    llguidance: the grammar without the vocabulary (milliseconds, under its fuel limits);
    refused keywords are named with their schema path."""
    if name == "llguidance":
        from .llguidance_backend import validate

        validate(spec)
    elif name == "outlines":
        import re

        from .spec import resolve

        regex = resolve(spec).regex
        try:
            re.compile(regex)
        except (re.error, RecursionError, OverflowError) as err:  # a repeat past 2^32, say
            raise ValueError(f"invalid regex: {err}") from None


def compile_checks_spec(name: str) -> bool:
    """The backend's compile refuses what check_spec refuses, with the same messages, so a
    caller that waits for the compile (stemma.Constraint) need not check first. llguidance:
    both build the same grammar (the check without the vocabulary), so checking first would
    build it twice. outlines: check_spec also compiles the regex with `re`; its compile
    does not."""
    return name == "llguidance"


def pick_backend(spec: ConstraintSpec, default: str, named: str | None = None) -> str:
    """The backend that decodes `spec`, checked: ValueError names what it cannot honour.

    A backend the request names is the one used. Otherwise a grammar goes to llguidance (only
    it takes one), and so does a JSON schema the outlines default cannot honour: a keyword it
    would silently drop (pydantic's `minimum` / `maximum` from `Field(ge=, le=)`, say) or a
    schema it cannot build. llguidance decodes such a schema as written, bounds included,
    where outlines could only refuse it; every schema outlines takes stays with outlines, so
    no request it served changes. When llguidance refuses the schema too, its error is the
    one raised for dropped keywords (it names the keyword and its path); for a schema outlines
    cannot build, outlines' own reason is."""
    if named is not None:
        check_spec(named, spec)
        return named
    if spec.ebnf is not None:
        check_spec("llguidance", spec)
        return "llguidance"
    try:
        check_spec(default, spec)
        return default
    except IgnoredKeywords:
        if default != "outlines":
            raise
        check_spec("llguidance", spec)  # its error names what it refuses in turn
    except ValueError as err:
        if default != "outlines" or spec.json_schema is None:
            raise
        try:
            check_spec("llguidance", spec)
        except ValueError:
            raise err from None  # outlines' reason (a size, say) is the first to fix
    return "llguidance"
