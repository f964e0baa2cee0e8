"""The llguidance grammar backend: an Earley parser over a lazily built lexer, so a constraint
costs milliseconds to compile whatever its bounded repetitions (no automaton over the vocabulary).

`LLGuidanceService.submit(spec)` returns at once; worker threads build the grammar (llguidance
drops the GIL) under llguidance's own fuel and size limits, and a compile still running at
the service's time limit fails its request (the build thread is left to end under its fuel).
Compiled grammars are cached by spec key (LRU); each request gets a deep copy, an
`LLGuidanceMatcher`, with the same methods the scheduler calls on the outlines Matcher.
"""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

from .jump_forward import utf8_prefix
from .llguidance_grammar import blocking_error, grammar_texts, refusal
from .spec import ConstraintSpec
from .vocabulary import CompileLimits

if TYPE_CHECKING:
    from ..faults import Faults
    from ..tokenizer import Tokenizer

MAX_ROLLBACK = 1024  # as the outlines Matcher: jump-forward drafts stay far below it


def ll_tokenizer(tokenizer: Tokenizer) -> Any:
    """The LLTokenizer over the model's tokenizer (about a second: build it once per engine)."""
    from llguidance import LLTokenizer

    eos = sorted(tokenizer.eos_token_ids)
    return LLTokenizer(tokenizer._tok.to_str(), n_vocab=tokenizer.vocab_size, eos_token=eos)


def parser_limits(limits: CompileLimits) -> Any:
    """llguidance's work bounds; the grammar size follows the regex-size limit."""
    from llguidance import LLParserLimits

    return LLParserLimits(max_grammar_size=max(limits.max_regex_chars, 500_000))


def compile_grammar(
    ll_tok: Any, spec: ConstraintSpec, limits: CompileLimits
) -> tuple[Any, list[str]]:
    """(a fresh LLMatcher at the start of `spec`, its warnings); ValueError names what cannot
    be honoured."""
    from llguidance import LLMatcher

    _check_size(spec, limits)
    errors = []
    for grammar, notes in grammar_texts(spec):
        matcher = LLMatcher(ll_tok, grammar, log_level=0, limits=parser_limits(limits))
        if not matcher.is_error():
            return matcher, notes + list(matcher.get_grammar_warnings())
        errors.append(matcher.get_error())
    raise ValueError(refusal(spec, blocking_error(errors)))


def validate(spec: ConstraintSpec, limits: CompileLimits | None = None) -> None:
    """Check `spec` compiles, without the vocabulary; ValueError as compile_grammar's."""
    from llguidance import LLMatcher

    limits = limits or CompileLimits()
    _check_size(spec, limits)
    errors = []
    for grammar, _ in grammar_texts(spec):
        is_error, messages = LLMatcher.validate_grammar_with_warnings(
            grammar, None, limits=parser_limits(limits)
        )
        if not is_error:
            return
        errors.append(messages[0] if messages else "")
    raise ValueError(refusal(spec, blocking_error(errors)))


def _check_size(spec: ConstraintSpec, limits: CompileLimits) -> None:
    if spec.regex is not None and len(spec.regex) > limits.max_regex_chars:
        raise ValueError(
            f"regex has {len(spec.regex)} characters, over the limit of {limits.max_regex_chars}"
        )


class LLGuidanceMatcher:
    """One request's position in an llguidance grammar (same interface as matcher.Matcher)."""

    __slots__ = ("_m", "eos_token_ids", "vocab_size", "is_terminated", "num_accepted")

    def __init__(self, matcher: Any, vocab_size: int, eos_token_ids: frozenset[int]) -> None:
        self._m, self.vocab_size, self.eos_token_ids = matcher, vocab_size, eos_token_ids
        self.is_terminated = False  # EOS accepted
        self.num_accepted = 0

    @property
    def error(self) -> str | None:
        """Set when the grammar failed mid-way (e.g. a step ran out of llguidance's fuel)."""
        if self._m.is_error():
            return (
                f"constraint failed after {self.num_accepted} tokens: "
                + (self._m.get_error().strip().splitlines() or ["unknown error"])[0]
            )
        return None

    def allows(self, token_id: int) -> bool:
        if token_id in self.eos_token_ids:
            return self.is_final()
        if self.is_terminated or not 0 <= token_id < self.vocab_size:
            return False
        return self._m.validate_tokens([token_id]) == 1

    def accept_token(self, token_id: int) -> None:
        """Advance over `token_id`; ValueError if the grammar does not allow it here."""
        if not self.allows(token_id):
            raise ValueError(
                self.error or f"token {token_id} is not allowed by the constraint here"
            )
        if token_id in self.eos_token_ids:
            self.is_terminated = True
            return
        if not self._m.consume_token(token_id):
            raise ValueError(f"token {token_id}: {self.error}")
        self.num_accepted += 1

    def rollback(self, num_tokens: int) -> None:
        """Undo the last num_tokens accepted (non-EOS) tokens."""
        if num_tokens:
            if num_tokens > min(MAX_ROLLBACK, self.num_accepted) or not self._m.rollback(
                num_tokens
            ):
                raise ValueError(f"cannot roll back {num_tokens} tokens")
            self.num_accepted -= num_tokens

    def is_final(self) -> bool:
        """The text so far is a complete match: EOS is allowed."""
        return not self.is_terminated and self._m.is_accepting()

    def is_finished(self) -> bool:
        """Nothing but EOS can follow (an errored grammar can only end too)."""
        return self.is_terminated or self._m.is_stopped() or self._m.is_error()

    def fill_mask(self, bitmask: Any, row: int | None = None) -> None:
        """Write the allowed tokens into `bitmask[row]` (or the 1-D `bitmask`): int32 words
        over ids; EOS bits set exactly where the text is complete or nothing else can follow."""
        words = bitmask.numpy() if hasattr(bitmask, "numpy") else bitmask
        target = words if row is None else words[row]
        num_words = (self.vocab_size + 31) // 32
        if target.shape[-1] < num_words:
            raise ValueError(f"bitmask row of {target.shape[-1]} words cannot hold the vocabulary")
        target[:] = 0
        if self.is_terminated:
            return
        self._m.unsafe_compute_mask_ptr(target.ctypes.data, num_words * 4)
        bits = target.view(np.uint32)
        for token_id in self.eos_token_ids:
            bits[token_id // 32] &= ~np.uint32(1 << (token_id % 32))
        if self._m.is_accepting() or not bits.any():
            for token_id in self.eos_token_ids:
                bits[token_id // 32] |= np.uint32(1 << (token_id % 32))

    def jump_forward(self, tokenizer: Tokenizer, *, stop_before_merge: bool = True) -> list[int]:
        """Ids of the text the grammar forces next, already accepted.

        stop_before_merge: llguidance's own forced tokens, which stop before any token the
        model could merge with free text. Otherwise (a draft the model verifies token by
        token, runtime/scheduler/draft.py) the whole forced text, tokenized canonically."""
        if self.is_finished():
            return []
        if stop_before_merge:
            ids = list(self._m.compute_ff_tokens())
        else:
            text = utf8_prefix(self._m.compute_ff_bytes())
            ids = tokenizer.encode(text) if text else []
        num_taken = self._m.try_consume_tokens(ids) if ids else 0
        self.num_accepted += num_taken
        return ids[:num_taken]


class LLGuidanceHandle:
    """A submitted constraint: poll `ready()`, then `error` or a fresh `matcher()`."""

    __slots__ = ("spec", "error", "warnings", "_template", "_service", "_done")

    def __init__(self, spec: ConstraintSpec, service: LLGuidanceService) -> None:
        self.spec, self._service = spec, service
        self.error: str | None = None
        self.warnings: list[str] = []
        self._template: Any = None
        self._done = threading.Event()

    def ready(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def matcher(self) -> LLGuidanceMatcher:
        if not self._done.is_set():
            raise RuntimeError("grammar is not compiled yet; poll ready() first")
        if self._template is None:
            raise ValueError(self.error)
        s = self._service
        return LLGuidanceMatcher(self._template.deep_copy(), s.vocab_size, s.eos_token_ids)

    def _finish(self, template: Any, error: str | None, warnings: list[str]) -> None:
        self._template, self.error, self.warnings = template, error, warnings
        self._done.set()


class LLGuidanceService:
    """Compiles constraints on worker threads; caches compiled grammars by spec key (LRU)."""

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
        self._done: OrderedDict[str, tuple[Any, str | None, list[str]]] = OrderedDict()
        self._in_flight: dict[str, LLGuidanceHandle] = {}
        self._jobs: queue.Queue[LLGuidanceHandle | None] = queue.Queue()
        self._workers = [
            threading.Thread(target=self._worker_loop, name=f"llguidance-{i}", daemon=True)
            for i in range(num_workers)
        ]
        for worker in self._workers:
            worker.start()

    def submit(self, spec: ConstraintSpec | str) -> LLGuidanceHandle:
        """Start compiling `spec` (a ConstraintSpec or a regex); returns at once."""
        spec = spec if isinstance(spec, ConstraintSpec) else ConstraintSpec(regex=spec)
        with self._lock:
            if (handle := self._in_flight.get(spec.key)) is not None:
                return handle
            handle = LLGuidanceHandle(spec, self)
            if (done := self._done.get(spec.key)) is not None:
                self._done.move_to_end(spec.key)
                handle._finish(*done)
                return handle
            self._in_flight[spec.key] = handle
        self._jobs.put(handle)
        return handle

    def close(self) -> None:
        self._closed.set()
        for _ in self._workers:
            self._jobs.put(None)
        for worker in self._workers:
            worker.join(timeout=5)

    def _worker_loop(self) -> None:
        while (handle := self._jobs.get()) is not None:
            out: list[tuple[Any, str | None, list[str]]] = []
            build = threading.Thread(target=self._build, args=(handle.spec, out), daemon=True)
            build.start()
            build.join(self.limits.timeout_s)
            template, error, warnings = out[0] if out else (None, self._timeout_error(), [])
            with self._lock:
                self._in_flight.pop(handle.spec.key, None)
                self._done[handle.spec.key] = (template, error, warnings)
                while len(self._done) > self.max_cached:
                    self._done.popitem(last=False)
            handle._finish(template, error, warnings)

    def _build(self, spec: ConstraintSpec, out: list[tuple[Any, str | None, list[str]]]) -> None:
        """Compile on a thread of its own, so the worker can stop waiting at the time limit."""
        if self.faults is not None and self.faults.take("compile_hang"):
            self._closed.wait()  # never answers while the service lives
            return
        try:
            template, warnings = compile_grammar(self.ll_tok, spec, self.limits)
            out.append((template, None, warnings))
        except ValueError as err:
            out.append((None, str(err), []))
        except Exception as err:  # a bug must still fail the request, never strand it
            error = f"internal error compiling the constraint: {type(err).__name__}: {err}"
            out.append((None, error, []))

    def _timeout_error(self) -> str:
        return (
            f"compiling the constraint took longer than the {self.limits.timeout_s:g} s limit "
            "(grammar_timeout_s); simplify the schema or raise the limit"
        )
