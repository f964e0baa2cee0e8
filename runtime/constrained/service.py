"""GrammarService: compiles constraints off the scheduler thread.

`submit(spec)` never blocks: building, validating and compiling the regex happen on worker
threads, each driving an IndexCompiler child process, so a runaway compile is killed at its
time or memory limit and fails only its own requests. Identical in-flight compiles are shared;
indexes are cached in memory (LRU by bytes) and on disk (disk_cache.py). The scheduler polls a
GrammarHandle and takes a fresh Matcher (matcher.py) per request once it is ready.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import queue
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..faults import Faults
from .disk_cache import disk_load, disk_store
from .matcher import CompiledGrammar, Matcher
from .spec import ConstraintSpec, resolve
from .vocabulary import CompileError, CompileLimits, IndexCompiler, Vocabulary

OUTLINES_CORE_VERSION = importlib.metadata.version("outlines_core")


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
        faults: Faults | None = None,
    ) -> None:
        self.vocab, self.limits, self.cache_dir = vocab, limits or CompileLimits(), cache_dir
        self.max_memory_cache_bytes, self.max_disk_cache_bytes = (
            max_memory_cache_bytes,
            max_disk_cache_bytes,
        )
        self.max_remembered = max_remembered
        self.faults = faults
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
        process = IndexCompiler(self._vocab_binary, self.limits, self.faults)
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
        data = disk_load(path) if path is not None else None
        from_disk = data is not None
        if data is None:
            data = process.compile(f"(?:{regex})\\x00")
            if path is not None:
                disk_store(path, data, self.max_disk_cache_bytes)
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
