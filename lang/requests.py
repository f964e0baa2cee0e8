"""The /generate requests the interpreter sends, and the checks every response passes.

gen -> `gen_request` at the state's text; fork and select warm a shared prefix with
`warm_request` (`max_new_tokens: 0`: prefill into the prefix cache, generate nothing).
A response whose finish_reason is "abort" raises, so a failed request never looks like text.
"""

from __future__ import annotations

from typing import Any

from .backend import BackendError
from .sampling import SamplingParams


def gen_request(text: str, params: SamplingParams, stream: bool = False) -> dict[str, Any]:
    """The request a gen sends: the whole state text as the prompt."""
    req: dict[str, Any] = {"text": text, "sampling_params": params.sampling_dict()}
    req.update(params.request_fields())
    if stream:
        req["stream"] = True
    return req


def warm_request(prompt: str | list[int]) -> dict[str, Any]:
    """Prefill `prompt` into the runtime's prefix cache without generating."""
    key = "text" if isinstance(prompt, str) else "input_ids"
    return {key: prompt, "sampling_params": {"max_new_tokens": 0}}


def as_responses(result: Any, expected: int) -> list[dict[str, Any]]:
    """The backend's answer as a list of `expected` checked response dicts."""
    items = result if isinstance(result, list) else [result]
    if len(items) != expected or not all(isinstance(item, dict) for item in items):
        raise BackendError(f"expected {expected} response dict(s) from the backend, got {result!r}")
    for item in items:
        check_response(item)
    return items


def check_response(response: dict[str, Any]) -> dict[str, Any]:
    """`response`, unless the runtime aborted it (then BackendError with its message)."""
    if "error" in response:
        error = response["error"]
        message = error.get("message", error) if isinstance(error, dict) else error
        raise BackendError(f"generate failed: {message}")
    finish = response.get("meta_info", {}).get("finish_reason")
    if isinstance(finish, dict) and finish.get("type") == "abort":
        raise BackendError(f"generate aborted: {finish.get('message', 'no message')}")
    return response
