"""The llguidance grammar backend: an Earley parser over a lazily built lexer, so a constraint
costs milliseconds to compile whatever its bounded repetitions (no automaton over the vocabulary).

`LLGuidanceService.submit(spec)` returns at once; builder threads build the grammar (llguidance
drops the GIL) under llguidance's own fuel and size limits, and a compile still running at
the service's time limit fails its request (its builder is replaced and left to end under its
fuel). Compiled grammars are cached by spec (LRU); each request gets a deep copy, an
`LLGuidanceMatcher` (llguidance_matcher.py), wrapped in a `BesideMatcher` where the schema's
`uniqueItems`, or under property_order "any" its objects' key rules, are enforced beside the
grammar. The grammar a spec resolved to (as written or rewritten) is remembered too
(`RESOLVED`), so the check at the request boundary (`validate`) and the compile after it build
and try it once.
"""

from __future__ import annotations

import itertools
import math
import queue
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from .llguidance_grammar import (
    Candidate,
    Resolution,
    Resolutions,
    blocking_error,
    grammar_texts,
    refusal,
)
from .llguidance_matcher import LLGuidanceMatcher
from .malloc_arena import share_main_arena
from .property_order import ObjectKeys
from .spec import ConstraintSpec
from .unique_items import UniqueArrays
from .unique_matcher import BesideMatcher, TokenBytes
from .vocabulary import CompileLimits

if TYPE_CHECKING:
    from ..faults import Faults
    from ..tokenizer import Tokenizer

# a compile's (template, error, warnings, and enforced beside the grammar: uniqueItems, keys)
_Outcome = tuple[Any, "str | None", list[str], "UniqueArrays | None", "ObjectKeys | None"]


def ll_tokenizer(tokenizer: Tokenizer) -> Any:
    """The LLTokenizer over the model's tokenizer (about a second: build it once per engine)."""
    from llguidance import LLTokenizer

    eos = sorted(tokenizer.eos_token_ids)
    return LLTokenizer(tokenizer._tok.to_str(), n_vocab=tokenizer.vocab_size, eos_token=eos)


def parser_limits(limits: CompileLimits) -> Any:
    """llguidance's work bounds; the grammar size follows the regex-size limit."""
    from llguidance import LLParserLimits

    return LLParserLimits(max_grammar_size=_grammar_size(limits))


RESOLVED = Resolutions()  # shared by validate and the compiles of every service


def compile_grammar(
    ll_tok: Any, spec: ConstraintSpec, limits: CompileLimits
) -> tuple[Any, list[str], Resolution]:
    """(a fresh LLMatcher at the start of `spec`, its warnings, the resolution it was built
    from: its key rules and uniqueItems to enforce beside it); ValueError names what cannot
    be honoured. A spec validated before builds only the grammar it resolved to."""
    from llguidance import LLMatcher

    _check_size(spec, limits)
    known = RESOLVED.get(spec, _grammar_size(limits))
    if known is not None and known.error is not None:
        raise ValueError(known.error)
    # the grammar validated before; where the vocabulary fails it, every one as before
    tried = [] if known is None else [_candidate(known)]
    errors: list[str] = []
    for num_tried, candidate in enumerate(itertools.chain(tried, grammar_texts(spec))):
        matcher = LLMatcher(ll_tok, candidate.grammar, log_level=0, limits=parser_limits(limits))
        if not matcher.is_error():
            resolution = _resolution(spec, candidate)
            RESOLVED.put(spec, _grammar_size(limits), resolution)
            return matcher, [*candidate.notes, *matcher.get_grammar_warnings()], resolution
        if num_tried >= len(tried):
            _note_error(errors, candidate, matcher.get_error())
    raise ValueError(refusal(spec, blocking_error(errors)))


def validate(spec: ConstraintSpec, limits: CompileLimits | None = None) -> None:
    """Check `spec` compiles, without the vocabulary; ValueError as compile_grammar's. The
    outcome is remembered (RESOLVED) for the compile that follows."""
    limits = limits or CompileLimits()
    _check_size(spec, limits)
    if (known := RESOLVED.get(spec, _grammar_size(limits))) is None:
        known = _resolve(spec, limits)
        RESOLVED.put(spec, _grammar_size(limits), known)
    if known.error is not None:
        raise ValueError(known.error)


def resolved_grammar(spec: ConstraintSpec, limits: CompileLimits | None = None) -> str:
    """The llguidance grammar `spec` resolves to (as validate finds it; its ValueError)."""
    limits = limits or CompileLimits()
    validate(spec, limits)
    known = RESOLVED.get(spec, _grammar_size(limits))
    if known is None or known.grammar is None:  # dropped from the LRU since: found again
        known = _resolve(spec, limits)
    assert known.grammar is not None
    return known.grammar


def _resolve(spec: ConstraintSpec, limits: CompileLimits) -> Resolution:
    """The first of `spec`'s grammar texts llguidance takes, or its refusal."""
    from llguidance import LLMatcher

    errors: list[str] = []
    for candidate in grammar_texts(spec):
        is_error, messages = LLMatcher.validate_grammar_with_warnings(
            candidate.grammar, None, limits=parser_limits(limits)
        )
        if not is_error:
            return _resolution(spec, candidate)
        _note_error(errors, candidate, messages[0] if messages else "")
    return Resolution(error=refusal(spec, blocking_error(errors)))


def _resolution(spec: ConstraintSpec, candidate: Candidate) -> Resolution:
    """What `spec` resolved to, where llguidance took `candidate`: uniqueItems is enforced
    beside the grammar where a rewrite left it out (not under strict=False, where llguidance
    approximates it and warns); a schema taken as written has none llguidance compiles."""
    unique = candidate.unique if spec.strict else None
    return Resolution(candidate.grammar, tuple(candidate.notes), keys=candidate.keys, unique=unique)


def _candidate(known: Resolution) -> Candidate:
    assert known.grammar is not None
    return Candidate(known.grammar, list(known.notes), known.keys, unique=known.unique)


def _note_error(errors: list[str], candidate: Candidate, error: str) -> None:
    """Keep a refusal for blocking_error: the schema's own order's only, as written first."""
    if candidate.keys is None:
        errors.insert(0 if candidate.as_written else len(errors), error)


def _grammar_size(limits: CompileLimits) -> int:
    return max(limits.max_regex_chars, 500_000)


def _check_size(spec: ConstraintSpec, limits: CompileLimits) -> None:
    if spec.regex is not None and len(spec.regex) > limits.max_regex_chars:
        raise ValueError(
            f"regex has {len(spec.regex)} characters, over the limit of {limits.max_regex_chars}"
        )


class LLGuidanceHandle:
    """A submitted constraint: poll `ready()`, then `error` or a fresh `matcher()`."""

    __slots__ = ("spec", "error", "warnings", "unique", "keys", "_template", "_service", "_done")

    def __init__(self, spec: ConstraintSpec, service: LLGuidanceService) -> None:
        self.spec, self._service = spec, service
        self.error: str | None = None
        self.warnings: list[str] = []
        self.unique: UniqueArrays | None = None  # uniqueItems enforced beside the grammar
        self.keys: ObjectKeys | None = None  # and object keys (property_order "any")
        self._template: Any = None
        self._done = threading.Event()

    def ready(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def matcher(self) -> LLGuidanceMatcher | BesideMatcher:
        if not self._done.is_set():
            raise RuntimeError("grammar is not compiled yet; poll ready() first")
        if self._template is None:
            raise ValueError(self.error)
        s = self._service
        m = LLGuidanceMatcher(self._template.deep_copy(), s.vocab_size, s.eos_token_ids)
        if self.unique is None and self.keys is None:
            return m
        arrays = self.unique or UniqueArrays(frozenset(), ())
        return BesideMatcher(m, arrays, s.token_bytes(), self.keys)

    def _finish(
        self,
        template: Any,
        error: str | None,
        warnings: list[str],
        unique: UniqueArrays | None,
        keys: ObjectKeys | None,
    ) -> None:
        self._template, self.error, self.warnings = template, error, warnings
        self.unique, self.keys = unique, keys
        self._done.set()


class LLGuidanceService:
    """Compiles constraints on builder threads; caches compiled grammars by spec (LRU).

    A builder takes one job at a time and finishes its handle itself, so a compile costs two
    thread hand-offs (scheduler to builder, builder to waiter). The watchdog sleeps until
    the earliest deadline of the compiles running; one still running then fails its request
    and a new builder takes the stuck one's place (it drops its result when it ends)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        limits: CompileLimits | None = None,
        *,
        num_workers: int = 2,
        max_cached: int = 1024,
        faults: Faults | None = None,
    ) -> None:
        self.limits, self.max_cached, self.faults = limits or CompileLimits(), max_cached, faults
        self._closed = threading.Event()  # releases a compile held by the compile_hang fault
        self.vocab_size = tokenizer.vocab_size
        self.eos_token_ids = frozenset(tokenizer.eos_token_ids)
        self.ll_tok = ll_tokenizer(tokenizer)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)  # the watchdog's
        self._wake_at = math.inf  # when the watchdog next looks (inf: no compile running)
        self._done: OrderedDict[ConstraintSpec, _Outcome] = OrderedDict()
        self._token_bytes: TokenBytes | None = None
        self._bytes_lock = threading.Lock()
        self._in_flight: dict[ConstraintSpec, LLGuidanceHandle] = {}
        self._running: dict[threading.Thread, tuple[LLGuidanceHandle, float]] = {}
        self._jobs: queue.SimpleQueue[LLGuidanceHandle | None] = queue.SimpleQueue()
        self._builders: list[threading.Thread] = []
        share_main_arena()  # a compile reuses the pages earlier work freed (malloc_arena.py)
        for _ in range(num_workers):
            self._start_builder()
        self._watchdog = threading.Thread(target=self._watch, name="llguidance-watch", daemon=True)
        self._watchdog.start()

    def submit(self, spec: ConstraintSpec | str) -> LLGuidanceHandle:
        """Start compiling `spec` (a ConstraintSpec or a regex); returns at once."""
        spec = spec if isinstance(spec, ConstraintSpec) else ConstraintSpec(regex=spec)
        with self._lock:  # keyed by the spec itself: its hash is cheaper than spec.key
            if (handle := self._in_flight.get(spec)) is not None:
                return handle
            handle = LLGuidanceHandle(spec, self)
            if (done := self._done.get(spec)) is not None:
                self._done.move_to_end(spec)
                handle._finish(*done)
                return handle
            self._in_flight[spec] = handle
        self._jobs.put(handle)
        return handle

    def token_bytes(self) -> TokenBytes:
        """Each token's bytes (built on first use: a pass over the vocabulary)."""
        with self._bytes_lock:
            if self._token_bytes is None:
                ids = range(self.vocab_size)
                self._token_bytes = TokenBytes([self.ll_tok.decode_bytes([i]) for i in ids])
            return self._token_bytes

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            builders = list(self._builders)
            self._wake.notify()
        for _ in builders:
            self._jobs.put(None)
        for thread in [*builders, self._watchdog]:
            thread.join(timeout=5)

    def _start_builder(self) -> None:
        builder = threading.Thread(target=self._builder_loop, name="llguidance", daemon=True)
        self._builders.append(builder)
        builder.start()

    def _builder_loop(self) -> None:
        me = threading.current_thread()
        while (handle := self._jobs.get()) is not None:
            with self._lock:
                deadline = time.monotonic() + self.limits.timeout_s
                self._running[me] = (handle, deadline)
                if deadline < self._wake_at:
                    self._wake.notify()
            outcome = self._build(handle.spec)
            with self._lock:
                if self._running.pop(me, None) is None:
                    return  # past the time limit: failed and replaced by the watchdog
                self._settle(handle, *outcome)

    def _watch(self) -> None:
        with self._lock:
            while not self._closed.is_set():
                now = time.monotonic()
                for builder, (handle, deadline) in list(self._running.items()):
                    if deadline <= now:
                        del self._running[builder]
                        self._builders.remove(builder)
                        self._settle(handle, None, self._timeout_error(), [], None, None)
                        self._start_builder()
                self._wake_at = min((d for _, d in self._running.values()), default=math.inf)
                self._wake.wait(None if self._wake_at == math.inf else self._wake_at - now)

    def _settle(self, handle: LLGuidanceHandle, *outcome: Any) -> None:
        """Cache the outcome and finish the handle (the lock held)."""
        self._in_flight.pop(handle.spec, None)
        self._done[handle.spec] = outcome  # type: ignore[assignment]
        while len(self._done) > self.max_cached:
            self._done.popitem(last=False)
        handle._finish(*outcome)

    def _build(self, spec: ConstraintSpec) -> _Outcome:
        """(template, error, warnings, unique arrays) of compiling `spec`."""
        if self.faults is not None and self.faults.take("compile_hang"):
            self._closed.wait()  # never answers while the service lives
            return None, "the service closed", [], None, None
        try:
            template, warnings, resolved = compile_grammar(self.ll_tok, spec, self.limits)
            if resolved.unique is not None or resolved.keys is not None:
                self.token_bytes()
            return template, None, warnings, resolved.unique, resolved.keys
        except ValueError as err:
            return None, str(err), [], None, None
        except Exception as err:  # a bug must still fail the request, never strand it
            error = f"internal error compiling the constraint: {type(err).__name__}: {err}"
            return None, error, [], None, None

    def _timeout_error(self) -> str:
        return (
            f"compiling the constraint took longer than the {self.limits.timeout_s:g} s limit "
            "(grammar_timeout_s); simplify the schema or raise the limit"
        )
