"""The Backend protocol: the six calls a program makes of a serving runtime.

A backend speaks the /generate protocol (SGLang-compatible request/response dicts, see
`generate`). Two implementations: `RuntimeEndpoint` (HTTP, lang/endpoint.py) and the in-process
`stemma.Runtime` (runtime/inprocess.py). Methods may be called from many threads at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, cast, runtime_checkable


class BackendError(RuntimeError):
    """A request the backend rejected or failed; carries the server's own message."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@runtime_checkable
class Backend(Protocol):
    """What the interpreter needs from a runtime. Every method may raise; errors reach the program.

    generate(req) -> dict | list[dict]
        `req` is a /generate request: exactly one of `text` (str | list[str]) or `input_ids`
        (list[int] | list[list[int]]); `sampling_params` (one dict for every prompt, or one
        per prompt; keys as in `SamplingParams.sampling_dict`, absent = runtime default);
        optional `return_logprob`, `logprob_start_len` (-1 = output only), `top_logprobs_num`,
        `return_text_in_logprobs`. Returns one response dict for a single prompt with n == 1,
        else a list: one per prompt, or n per prompt (prompt-major) when n > 1.
        Response: {"text": str (completion only, stop string trimmed), "output_ids": list[int],
        "meta_info": {"id", "prompt_tokens", "completion_tokens", "cached_tokens",
        "finish_reason": {"type": "stop", "matched": ...} | {"type": "length", "length": N}
        | {"type": "abort", "message": str}, "e2e_latency", and with return_logprob
        "input_token_logprobs" / "output_token_logprobs": lists of [logprob, token_id,
        text | None]}}. `input_token_logprobs` covers prompt positions logprob_start_len..end;
        the logprob of prompt position 0 is null. `max_new_tokens: 0` prefills (caches) the
        prompt and generates nothing. A rejected request raises (e.g. BackendError).
    generate_stream(req) -> Iterator[dict]
        Same request (with "stream": True, single prompt, n == 1); yields response dicts whose
        `text` is cumulative (all the completion so far); the last one carries the full
        `meta_info`. A failure raises, or ends the stream with an "abort" finish_reason.
    get_model_info() -> dict
        At least {"model_path": str}; HTTP servers also put `chat_template` here.
    get_chat_template() -> dict | None
        {"roles": {"system": [prefix, suffix], "user": [...], "assistant": [...]},
        "default_system_prompt": str | None}, rendered from the model's own template;
        None when the model has none. Called at most once per run()/run_batch().
    tokenize(text) -> list[int]
        The token ids the runtime would prefill for `text` sent as a prompt (with the BOS the
        runtime adds, if any). select sends `input_ids` built from these, so they must match.
    flush_cache() -> None
        Empty the runtime's prefix cache.

    What the DSL sends: a gen, {"text": state text, "sampling_params": {...}}; a fork of n > 1
    and run_batch's traced prefix, {"text": prefix, "sampling_params": {"max_new_tokens": 0}};
    a select, {"input_ids": prefix_ids, max_new_tokens 0}, then {"input_ids": [prefix_ids +
    choice_ids, ...], "logprob_start_len": len(prefix_ids), "return_logprob": True,
    max_new_tokens 0} (and the same with only BOS as the prefix for unconditional scoring).
    """

    def generate(self, req: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]: ...

    def generate_stream(self, req: dict[str, Any]) -> Iterator[dict[str, Any]]: ...

    def get_model_info(self) -> dict[str, Any]: ...

    def get_chat_template(self) -> dict[str, Any] | None: ...

    def tokenize(self, text: str) -> list[int]: ...

    def flush_cache(self) -> None: ...


_default_backend: Backend | None = None


def set_default_backend(backend: Backend | None) -> None:
    """Use `backend` for every run() that names none (None: no default)."""
    global _default_backend
    _default_backend = None if backend is None else check_backend(backend)


def get_default_backend() -> Backend | None:
    return _default_backend


def resolve_backend(backend: Backend | None) -> Backend:
    """`backend`, else the default one; raises if neither is set."""
    chosen = backend if backend is not None else _default_backend
    if chosen is None:
        raise ValueError(
            "no backend: pass backend=... or call set_default_backend(RuntimeEndpoint(url))"
        )
    return check_backend(chosen)


def check_backend(backend: Any) -> Backend:
    missing = [
        name
        for name in ("generate", "generate_stream", "get_chat_template", "tokenize")
        if not callable(getattr(backend, name, None))
    ]
    if missing:
        raise TypeError(f"{backend!r} is not a Backend: it lacks {', '.join(missing)}")
    return cast(Backend, backend)


def flush_cache(backend: Backend | None = None) -> None:
    """Empty the prefix cache of `backend` (default: the default backend)."""
    resolve_backend(backend).flush_cache()
