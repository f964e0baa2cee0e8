"""Runtime: the DSL's Backend over an in-process Engine (`stemma.Runtime(model=...)`).

The same /generate request dicts the HTTP endpoint would carry go straight to
Engine.generate, so programs run against the engine without a server.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .engine import Engine


class Runtime:
    def __init__(
        self,
        model: str | None = None,
        *,
        model_path: str | None = None,
        engine: Engine | None = None,
        **config: Any,
    ):
        """A Runtime over a new Engine(model, **config) (`model_path` is SGLang's name for
        `model`), or over an existing `engine`."""
        if engine is None:
            engine = Engine(model, model_path=model_path, **config)
        self.engine = engine

    def generate(self, req: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
        return self.engine.generate(**req)

    def generate_stream(self, req: dict[str, Any]) -> Iterator[dict[str, Any]]:
        return self.engine.generate(**{**req, "stream": True})

    def get_model_info(self) -> dict[str, Any]:
        return self.engine.get_model_info()

    def get_chat_template(self) -> dict[str, Any] | None:
        return self.engine.get_model_info()["chat_template"]

    def tokenize(self, text: str) -> list[int]:
        return self.engine.tokenize(text)

    def flush_cache(self) -> None:
        self.engine.flush_cache()

    def shutdown(self) -> None:
        self.engine.shutdown()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
