"""The engine's door to constrained decoding: validate a request's constraint up front
(bad input is the caller's error, before anything is queued), then compile it off the
scheduler thread; the scheduler admits the request once its grammar is ready.
"""

from __future__ import annotations

import threading
from pathlib import Path

from ..faults import Faults
from ..sampling.params import SamplingParams
from ..tokenizer import Tokenizer
from .backend import GrammarBackend, GrammarHandleLike, check_backend, create_backend, pick_backend
from .spec import ConstraintSpec
from .structural_tag import structural_tag_grammar
from .vocabulary import CompileLimits


class Constraints:
    def __init__(
        self,
        tokenizer: Tokenizer,
        cache_dir: Path | None,
        limits: CompileLimits,
        faults: Faults | None = None,
        backend: str = "outlines",
    ):
        self.backend = check_backend(backend)  # backend.py: outlines | llguidance
        self.tokenizer = tokenizer
        self.faults = faults
        self.cache_dir = cache_dir
        self.limits = limits
        self._services: dict[str, GrammarBackend] = {}
        self._services_lock = threading.Lock()  # submit runs on any caller's thread

    @property
    def service(self) -> GrammarBackend:
        """The engine's default backend's service."""
        return self.service_for(self.backend)

    def service_for(self, backend: str) -> GrammarBackend:
        with self._services_lock:
            if backend not in self._services:  # its vocabulary costs a second: on first use
                self._services[backend] = create_backend(
                    backend,
                    self.tokenizer,
                    cache_dir=self.cache_dir,
                    limits=self.limits,
                    faults=self.faults,
                )
            return self._services[backend]

    def submit(self, params: SamplingParams) -> GrammarHandleLike | None:
        """Start compiling params' constraint; None if it has none. ValueError on bad input."""
        ebnf = params.ebnf
        if params.structural_tag is not None:
            ebnf = structural_tag_grammar(params.structural_tag)
        if params.regex is None and params.json_schema is None and ebnf is None:
            return None
        spec = ConstraintSpec.create(
            regex=params.regex,
            json_schema=params.json_schema,
            ebnf=ebnf,
            property_order=params.property_order or "schema",
        )
        # unsupported features and schema keywords, by name; a grammar, or a schema the
        # outlines default cannot honour, goes to llguidance unless the request names a backend
        backend = pick_backend(spec, self.backend, params.grammar_backend)
        return self.service_for(backend).submit(spec)

    def close(self) -> None:
        for service in self._services.values():
            service.close()
