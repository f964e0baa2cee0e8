"""Grammar compilation service, and the per-request Matcher that walks a compiled grammar.

`GrammarService.submit(spec)` never blocks: building, validating and compiling the regex happen
on worker threads, each driving an IndexCompiler child process, so a runaway compile is killed
at its time or memory limit and fails only its own requests. Identical in-flight compiles are
shared; indexes are cached in memory (LRU by bytes) and on disk. Every pattern R is compiled as
`(?:R)\\x00`: R is complete exactly where the NUL end marker may follow (outlines-core's own
final states wrongly reject most tokens that leave them). A Matcher belongs to one thread.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import queue
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .jump_forward import jump_forward
from .spec import ConstraintSpec, resolve
from .vocabulary import CompileError, CompileLimits, IndexCompiler, Vocabulary

if TYPE_CHECKING:
    import torch

    from ..tokenizer import Tokenizer

__all__ = [
    "CompileError",
    "CompileLimits",
    "CompiledGrammar",
    "GrammarHandle",
    "GrammarService",
    "Matcher",
    "default_grammar_cache_dir",
    "fill_bitmask",
]

logger = logging.getLogger(__name__)
OUTLINES_CORE_VERSION = importlib.metadata.version("outlines_core")
_DISK_MAGIC = b"stemma-grammar-1\n"


@dataclass(slots=True)
class GrammarStats:
    memory_hits: int = 0
    disk_hits: int = 0
    compiles: int = 0
    failures: int = 0


def default_grammar_cache_dir() -> Path:
    """Where an engine should keep compiled indexes (next to the loader's model cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "stemma" / "grammar"


MAX_ROLLBACK = 1024  # tokens a Matcher can undo (jump-forward drafts are capped below this)


class CompiledGrammar:
    """One pattern's Index plus per-state caches shared by all its matchers.

    Mask rows are int32 words over ids [0, vocab_size] (the last id is the end marker, whose bit
    is always cleared); EOS bits are set exactly in final states.
    """

    def __init__(self, regex: str, index: Any, vocab: Vocabulary, num_bytes: int) -> None:
        self.regex, self.index, self.vocab, self.num_bytes = regex, index, vocab, num_bytes
        self.num_words = (vocab.vocab_size + 1 + 31) // 32
        self.max_cached_rows = 4096
        self._rows: OrderedDict[int, np.ndarray] = OrderedDict()
        self._final: dict[int, bool] = {}
        self._finished: dict[int, bool] = {}
        self.dead_states: set[int] = set()
        self.jump_cache: dict[int, tuple[int | None, int]] = {}  # owned by jump_forward.py

    def is_final(self, state: int) -> bool:
        if (final := self._final.get(state)) is None:
            end = self.index.get_next_state(state, self.vocab.end_marker_id)
            final = self._final[state] = end is not None and self.index.is_final_state(end)
        return final

    def allowed_ids(self, state: int) -> list[int]:
        marker = self.vocab.end_marker_id
        return [t for t in self.index.get_allowed_tokens(state) if t != marker]

    def is_finished(self, state: int) -> bool:
        """Nothing but EOS can follow (true in a dead state too: it can only end)."""
        if (finished := self._finished.get(state)) is None:
            finished = self._finished[state] = not self.allowed_ids(state)
            if finished and not self.is_final(state):
                self.dead_states.add(state)
        return finished

    def mask_row(self, state: int, guide: Any) -> np.ndarray:
        """The allowed-token bitmask row for `state` (`guide` must stand at `state`)."""
        row = self._rows.get(state)
        if row is not None:
            self._rows.move_to_end(state)
            return row
        row = np.empty(self.num_words, dtype=np.int32)
        guide.write_mask_into(row.ctypes.data, row.size, 4)
        bits = row.view(np.uint32)
        for token_id in (self.vocab.end_marker_id, *self.vocab.eos_token_ids):
            bits[token_id // 32] &= ~np.uint32(1 << (token_id % 32))
        if self.is_final(state) or not bits.any():
            if not self.is_final(state):
                self.dead_states.add(state)
            for token_id in self.vocab.eos_token_ids:
                bits[token_id // 32] |= np.uint32(1 << (token_id % 32))
        self._rows[state] = row
        if len(self._rows) > self.max_cached_rows:
            self._rows.popitem(last=False)
        return row


class Matcher:
    """One request's position in a compiled grammar."""

    __slots__ = ("grammar", "state", "is_terminated", "num_accepted", "_guide")

    def __init__(self, grammar: CompiledGrammar) -> None:
        from outlines_core import Guide

        self.grammar = grammar
        self.state: int = grammar.index.get_initial_state()
        self.is_terminated = False  # EOS accepted
        self.num_accepted = 0
        # Advanced in lockstep; writes uncached mask rows; can undo a rejected draft.
        self._guide = Guide(grammar.index, max_rollback=MAX_ROLLBACK)

    @property
    def error(self) -> str | None:
        """Set when no token can continue the pattern here (the request can only end)."""
        if self.state in self.grammar.dead_states:
            return f"no token can continue the constraint after {self.num_accepted} tokens"
        return None

    def allows(self, token_id: int) -> bool:
        vocab = self.grammar.vocab
        if token_id in vocab.eos_token_ids:
            return self.is_final()
        if self.is_terminated or not 0 <= token_id < vocab.vocab_size:
            return False
        return self.grammar.index.get_next_state(self.state, token_id) is not None

    def accept_token(self, token_id: int) -> None:
        """Advance over `token_id`; ValueError if the pattern does not allow it here."""
        if not self.allows(token_id):
            vocab = self.grammar.vocab
            data = vocab.token_bytes[token_id] if 0 <= token_id < vocab.vocab_size else None
            raise ValueError(f"token {token_id} ({data!r}) is not allowed by the constraint here")
        if token_id in self.grammar.vocab.eos_token_ids:
            self.is_terminated = True
            return
        self.state = self.grammar.index.get_next_state(self.state, token_id)
        self._guide.advance(token_id, return_tokens=False)
        self.num_accepted += 1

    def rollback(self, num_tokens: int) -> None:
        """Undo the last num_tokens accepted (non-EOS) tokens, at most MAX_ROLLBACK."""
        if num_tokens:
            self._guide.rollback_state(num_tokens)
            self.state = self._guide.get_state()
            self.num_accepted -= num_tokens

    def is_final(self) -> bool:
        """The text so far matches the whole pattern: EOS is allowed."""
        return not self.is_terminated and self.grammar.is_final(self.state)

    def is_finished(self) -> bool:
        """Nothing but EOS can follow: the request should finish now."""
        return self.is_terminated or self.grammar.is_finished(self.state)

    def fill_mask(self, bitmask: Any, row: int | None = None) -> None:
        """Write this request's allowed tokens into `bitmask[row]` (or the 1-D `bitmask`).

        bitmask: int32 CPU tensor or array, [num_words] or [batch, num_words], with
        num_words >= ceil(vocab_size / 32); words past the vocabulary are zeroed.
        """
        words = bitmask.numpy() if hasattr(bitmask, "numpy") else bitmask
        target = words if row is None else words[row]
        if target.shape[-1] * 32 < self.grammar.vocab.vocab_size:
            raise ValueError(f"bitmask row of {target.shape[-1]} words cannot hold the vocabulary")
        source = self.grammar.mask_row(self.state, self._guide)
        n = min(len(source), target.shape[-1])
        target[:n] = source[:n]
        target[n:] = 0
        if self.is_terminated:
            target[:] = 0

    def jump_forward(self, tokenizer: Tokenizer, *, stop_before_merge: bool = True) -> list[int]:
        """Ids of the text the pattern forces next, already accepted (see jump_forward.py)."""
        return jump_forward(self, tokenizer, stop_before_merge=stop_before_merge)


def fill_bitmask(
    matchers: list[Matcher | None], vocab_size: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """[B, ceil(vocab_size / 32)] int32 masks; a None row is all ones (unconstrained)."""
    import torch

    num_words = (vocab_size + 31) // 32
    if out is None:
        out = torch.empty(len(matchers), num_words, dtype=torch.int32)
    if tuple(out.shape) != (len(matchers), num_words) or out.dtype != torch.int32:
        raise ValueError(f"out must be int32 [{len(matchers)}, {num_words}], got {out.shape}")
    words = out.numpy()  # numpy, not torch ops: no intra-op thread wake-ups per step
    words.fill(-1)
    for row, matcher in enumerate(matchers):
        if matcher is not None:
            matcher.fill_mask(words, row)
    return out


class GrammarHandle:
    """A submitted constraint; identical in-flight submissions share one handle.

    The scheduler polls `ready()`; then either `error` is set (fail the request with it) or
    `matcher()` gives a fresh Matcher per request. `warnings` lists what was loosened.
    """

    __slots__ = ("spec", "error", "warnings", "_grammar", "_done")

    def __init__(self, spec: ConstraintSpec) -> None:
        self.spec = spec
        self.error: str | None = None
        self.warnings: list[str] = []
        self._grammar: CompiledGrammar | None = None
        self._done = threading.Event()

    def ready(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until ready (for offline use and tests; the scheduler polls `ready`)."""
        return self._done.wait(timeout)

    def matcher(self) -> Matcher:
        if not self._done.is_set():
            raise RuntimeError("grammar is not compiled yet; poll ready() first")
        if self._grammar is None:
            raise ValueError(self.error)
        return Matcher(self._grammar)

    def _finish(self, grammar: CompiledGrammar | None, error: str | None) -> None:
        self._grammar, self.error = grammar, error
        self._done.set()


@dataclass(slots=True)
class _Caches:
    """What the service remembers; guarded by GrammarService._lock."""

    grammars: OrderedDict[str, CompiledGrammar] = field(default_factory=OrderedDict)
    num_bytes: int = 0
    regex_keys: OrderedDict[str, tuple[str, list[str]]] = field(default_factory=OrderedDict)
    failures: OrderedDict[str, str] = field(default_factory=OrderedDict)  # spec or regex key
    in_flight: dict[str, GrammarHandle] = field(default_factory=dict)  # by spec key
    compiling: dict[str, threading.Event] = field(default_factory=dict)  # by regex key


class GrammarService:
    """Compiles constraints off the scheduler thread; see the module docstring."""

    def __init__(
        self,
        vocab: Vocabulary,
        *,
        cache_dir: Path | None = None,
        limits: CompileLimits | None = None,
        num_workers: int = 2,
        max_memory_cache_bytes: int = 1 << 30,
        max_disk_cache_bytes: int = 4 << 30,
        max_remembered: int = 4096,
    ) -> None:
        self.vocab, self.limits, self.cache_dir = vocab, limits or CompileLimits(), cache_dir
        self.max_memory_cache_bytes, self.max_disk_cache_bytes = (
            max_memory_cache_bytes,
            max_disk_cache_bytes,
        )
        self.max_remembered = max_remembered
        self.stats = GrammarStats()
        self._vocab_binary = vocab.to_binary()
        self._lock = threading.Lock()
        self._caches = _Caches()
        self._jobs: queue.Queue[GrammarHandle | None] = queue.Queue()
        self._workers = [
            threading.Thread(target=self._worker_loop, name=f"grammar-{i}", daemon=True)
            for i in range(num_workers)
        ]
        for worker in self._workers:
            worker.start()

    def submit(self, spec: ConstraintSpec | str) -> GrammarHandle:
        """Start compiling `spec` (a ConstraintSpec or a regex); returns at once."""
        spec = spec if isinstance(spec, ConstraintSpec) else ConstraintSpec(regex=spec)
        key = spec.key
        with self._lock:
            c = self._caches
            if (handle := c.in_flight.get(key)) is not None:
                return handle
            handle = GrammarHandle(spec)
            regex_key, warnings = c.regex_keys.get(key, ("", []))
            error = c.failures.get(key) or c.failures.get(regex_key)
            if error is not None or regex_key in c.grammars:
                handle.warnings = warnings
                handle._finish(c.grammars.get(regex_key), error)
                if error is None:
                    c.grammars.move_to_end(regex_key)
                    self.stats.memory_hits += 1
                return handle
            c.in_flight[key] = handle
        self._jobs.put(handle)
        return handle

    def close(self) -> None:
        for _ in self._workers:
            self._jobs.put(None)
        for worker in self._workers:
            worker.join(timeout=5)

    def __enter__(self) -> GrammarService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _worker_loop(self) -> None:
        process = IndexCompiler(self._vocab_binary, self.limits)
        try:
            while (handle := self._jobs.get()) is not None:
                self._serve(handle, process)
        finally:
            process.kill()

    def _serve(self, handle: GrammarHandle, process: IndexCompiler) -> None:
        grammar, error, key = None, None, handle.spec.key
        try:
            resolved = resolve(handle.spec)
            handle.warnings = resolved.warnings
            regex_key = _sha(resolved.regex)
            with self._lock:
                _remember(self._caches.regex_keys, key, (regex_key, resolved.warnings), self)
            grammar = self._grammar_for(resolved.regex, regex_key, process)
        except ValueError as err:  # invalid constraint or CompileError
            error = str(err)
        except Exception as err:  # a bug must still fail the request, never strand it
            error = f"internal error compiling the constraint: {type(err).__name__}: {err}"
        with self._lock:
            self._caches.in_flight.pop(key, None)
            if error is not None:
                self.stats.failures += 1
                _remember(self._caches.failures, key, error, self)
        handle._finish(grammar, error)

    def _grammar_for(self, regex: str, regex_key: str, process: IndexCompiler) -> CompiledGrammar:
        while True:
            with self._lock:
                c = self._caches
                if (grammar := c.grammars.get(regex_key)) is not None:
                    self.stats.memory_hits += 1
                    return grammar
                if (error := c.failures.get(regex_key)) is not None:
                    raise CompileError(error)
                event = c.compiling.get(regex_key)
                if event is None:
                    event = c.compiling[regex_key] = threading.Event()
                    break
            event.wait()  # the same regex is compiling on another worker; then re-check
        try:
            grammar = self._load_or_compile(regex, regex_key, process)
            with self._lock:
                self._insert(regex_key, grammar)
            return grammar
        except CompileError as err:
            with self._lock:
                _remember(self._caches.failures, regex_key, str(err), self)
            raise
        finally:
            with self._lock:
                self._caches.compiling.pop(regex_key).set()

    def _load_or_compile(
        self, regex: str, regex_key: str, process: IndexCompiler
    ) -> CompiledGrammar:
        from outlines_core import Index

        if len(regex) > self.limits.max_regex_chars:
            raise CompileError(
                f"pattern has {len(regex)} characters, over the limit of "
                f"{self.limits.max_regex_chars}"
            )
        path = self._disk_path(regex_key)
        data = _disk_load(path) if path is not None else None
        from_disk = data is not None
        if data is None:
            data = process.compile(f"(?:{regex})\\x00")
            if path is not None:
                _disk_store(path, data, self.max_disk_cache_bytes)
        with self._lock:
            self.stats.disk_hits += from_disk
            self.stats.compiles += not from_disk
        return CompiledGrammar(regex, Index.from_binary(data), self.vocab, len(data))

    def _insert(self, regex_key: str, grammar: CompiledGrammar) -> None:
        c = self._caches
        c.grammars[regex_key] = grammar
        c.num_bytes += grammar.num_bytes
        while c.num_bytes > self.max_memory_cache_bytes and len(c.grammars) > 1:
            c.num_bytes -= c.grammars.popitem(last=False)[1].num_bytes

    def _disk_path(self, regex_key: str) -> Path | None:
        if self.cache_dir is None:
            return None
        name = f"{regex_key}-{self.vocab.fingerprint[:16]}-oc{OUTLINES_CORE_VERSION}.idx"
        return Path(self.cache_dir) / name


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _remember(cache: OrderedDict[str, Any], key: str, value: Any, service: GrammarService) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > service.max_remembered:
        cache.popitem(last=False)


def _disk_load(path: Path) -> bytes | None:
    """The cached index bytes, or None (a corrupt file is deleted; disk errors are a miss)."""
    try:
        blob = path.read_bytes()
        n = len(_DISK_MAGIC)
        head, digest, data = blob[:n], blob[n : n + 32], blob[n + 32 :]
        if head != _DISK_MAGIC or hashlib.sha256(data).digest() != digest:
            path.unlink(missing_ok=True)
            return None
        os.utime(path)  # recency for eviction
        return data
    except FileNotFoundError:
        return None
    except OSError as err:
        logger.warning("grammar disk cache: cannot read %s: %s", path, err)
        return None


def _disk_store(path: Path, data: bytes, max_total_bytes: int) -> None:
    """Atomic write, then evict least recently used files until under `max_total_bytes`.

    A full or read-only disk only costs the cache entry, never the request.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as f:
            f.write(_DISK_MAGIC + hashlib.sha256(data).digest() + data)
        os.replace(f.name, path)
        sizes = {p: p.stat() for p in path.parent.glob("*.idx")}
        total = sum(s.st_size for s in sizes.values())
        for old in sorted(sizes, key=lambda p: sizes[p].st_mtime):
            if total <= max_total_bytes:
                break
            if old != path:
                total -= sizes[old].st_size
                old.unlink(missing_ok=True)
    except OSError as err:
        logger.warning("grammar disk cache: cannot write %s: %s", path, err)
