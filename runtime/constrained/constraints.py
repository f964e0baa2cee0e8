"""The engine's door to constrained decoding: validate a request's constraint up front
(bad input is the caller's error, before anything is queued), then compile it off the
scheduler thread; the scheduler admits the request once its grammar is ready.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

from ..faults import Faults
from ..sampling.params import SamplingParams
from ..tokenizer import Tokenizer
from .service import GrammarHandle, GrammarService
from .spec import ConstraintSpec, resolve
from .vocabulary import CompileLimits


class Constraints:
    def __init__(
        self,
        tokenizer: Tokenizer,
        cache_dir: Path | None,
        limits: CompileLimits,
        faults: Faults | None = None,
    ):
        self.tokenizer = tokenizer
        self.faults = faults
        self.cache_dir = cache_dir
        self.limits = limits
        self._service: GrammarService | None = None
        self._service_lock = threading.Lock()  # submit runs on any caller's thread

    @property
    def service(self) -> GrammarService:
        with self._service_lock:
            if self._service is None:  # the vocabulary costs a second; build it on first use
                from .vocabulary import Vocabulary

                vocab = Vocabulary.from_tokenizer(self.tokenizer)
                self._service = GrammarService(
                    vocab, cache_dir=self.cache_dir, limits=self.limits, faults=self.faults
                )
            return self._service

    def submit(self, params: SamplingParams) -> GrammarHandle | None:
        """Start compiling params' constraint; None if it has none. ValueError on bad input."""
        if params.ebnf is not None or params.structural_tag is not None:
            raise ValueError(
                "ebnf and structural_tag constraints are not supported; use regex or json_schema"
            )
        if params.regex is None and params.json_schema is None:
            return None
        spec = ConstraintSpec.create(regex=params.regex, json_schema=params.json_schema)
        regex = resolve(spec).regex  # unsupported features and schema keywords, by name
        try:
            re.compile(regex)
        except (re.error, RecursionError, OverflowError) as err:  # a repeat past 2^32, say
            raise ValueError(f"invalid regex: {err}") from None
        return self.service.submit(spec)

    def close(self) -> None:
        if self._service is not None:
            self._service.close()
