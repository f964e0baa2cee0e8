"""What all states of one run()/run_batch() share: backend, sampling defaults, cached lookups.

The chat template and token ids the backend gives are fetched once per context, however many
programs and fork branches use them. A tracing context (no requests, see tracer.py) stops the
program at the first thing that is not constant text by raising StopTrace.
"""

from __future__ import annotations

import contextvars
import threading
from dataclasses import dataclass, field

from .backend import Backend
from .chat_template import ChatTemplate
from .sampling import SamplingParams

# True while a program body runs, so `other_program(...)` there means "a call to inline".
in_program: contextvars.ContextVar[bool] = contextvars.ContextVar("in_program", default=False)

_MAX_CACHED_TOKENIZATIONS = 4096


class StopTrace(BaseException):
    """Raised inside a traced program where its text stops being constant.

    A BaseException so that a program's own `except Exception` cannot swallow it.
    """


@dataclass(slots=True)
class RunContext:
    """The backend and program-level defaults of one run, and lookups cached across its states."""

    backend: Backend | None
    defaults: SamplingParams = field(default_factory=SamplingParams)
    is_streaming: bool = False
    is_tracing: bool = False
    _template: ChatTemplate | None = None
    _token_cache: dict[str, list[int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def require_backend(self) -> Backend:
        if self.backend is None:
            assert self.is_tracing, "only a tracing context runs without a backend"
            raise StopTrace
        return self.backend

    def chat_template(self) -> ChatTemplate:
        """The model's role markers, fetched from the backend on first use."""
        with self._lock:
            if self._template is None:
                data = self.require_backend().get_chat_template()
                self._template = ChatTemplate.from_dict(data)
            return self._template

    def tokenize_cached(self, text: str) -> list[int]:
        """`backend.tokenize(text)`, remembered (for choices and the empty string, asked often)."""
        with self._lock:
            cached = self._token_cache.get(text)
        if cached is not None:
            return cached
        ids = list(self.require_backend().tokenize(text))
        with self._lock:
            if len(self._token_cache) < _MAX_CACHED_TOKENIZATIONS:
                self._token_cache[text] = ids
        return ids
