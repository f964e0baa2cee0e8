"""The native SGLang-compatible request models (pydantic) and their conversion to the engine's
/generate request dict.

The models check JSON types and reject unknown fields; ranges and cross-field rules stay with
`SamplingParams` / `GenerateRequest`, which the engine applies. The server adds what needs the
model's limits: prompts are tokenized here, so a prompt over the context length or a
max_new_tokens that cannot fit is a 400 before anything is queued.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..config import EngineConfig
from ..constrained.backend import pick_backend
from ..constrained.spec import ConstraintSpec, constraint_regex
from ..limits import check_bounds, check_schema_bounds
from .errors import APIError
from .sglang_fields import accept_sglang_fields
from .state import ServerState

STRICT = ConfigDict(extra="forbid", strict=True)


class SamplingParamsIn(BaseModel):
    """SGLang's `sampling_params`; null means "not set"."""

    model_config = STRICT
    max_new_tokens: int | None = Field(None, description="0 = prefill (cache) only")
    min_new_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    temperature: float | None = Field(None, description="0 = greedy")
    top_p: float | None = None
    top_k: int | None = Field(None, description="-1 or 0 = off")
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    n: int | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    sampling_seed: int | None = None
    regex: str | None = None
    json_schema: str | dict[str, Any] | None = None
    ebnf: str | None = None
    structural_tag: str | dict[str, Any] | None = None
    custom_params: dict[str, Any] | None = None
    stream_interval: int | None = None
    grammar_backend: str | None = Field(None, description="outlines | llguidance (stemma's)")
    property_order: str | None = Field(None, description="schema | any (stemma's)")
    close_early: bool | None = Field(None, description="end valid within max_new_tokens")


class GenerateIn(BaseModel):
    """POST /generate: exactly one of text / input_ids, each single or a list (a batch).
    Other fields of SGLang's GenerateReqInput pass when they ask for nothing
    (sglang_fields.py)."""

    model_config = ConfigDict(extra="allow", strict=True)
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: SamplingParamsIn | list[SamplingParamsIn] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] | None = Field(None, description="one, or one per prompt")
    logprob_start_len: int | list[int] | None = Field(None, description="-1 = output only")
    top_logprobs_num: int | list[int] | None = None
    token_ids_logprob: list[int] | None = None
    return_text_in_logprobs: bool | None = None
    stream: bool = False
    cache_salt: str | None = Field(None, description="prefix cache shared only with this salt")


class TokenizeIn(BaseModel):
    """/tokenize and /v1/tokenize, as SGLang's: exactly one of `prompt` (str or list) or chat
    `messages` (rendered with the model's template); `text` is stemma's older name for
    `prompt`. The engine adds no special tokens to a prompt, so neither does this."""

    model_config = STRICT
    model: str | None = None
    prompt: str | list[str] | None = None
    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool | None = None


class DetokenizeIn(BaseModel):
    """/detokenize and /v1/detokenize: token ids (one list or a list of lists) to text."""

    model_config = STRICT
    model: str | None = None
    tokens: list[int] | list[list[int]]
    skip_special_tokens: bool = True


class AbortIn(BaseModel):
    model_config = STRICT
    rid: str | None = None
    abort_all: bool = False


def check_regex(pattern: str, param: str) -> None:
    """A regex that does not compile, or uses what constrained decoding cannot honour, is a
    400 now rather than a failed request later."""
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise APIError(400, f"{param} {pattern!r} does not compile: {e}", param) from None
    try:
        constraint_regex(regex=pattern)
    except (ValueError, TypeError, RecursionError, OverflowError) as e:
        raise APIError(400, f"{param}: {e}", param) from None


def check_json_schema(
    schema: str | dict[str, Any], param: str, limits: EngineConfig, routed: bool = False
) -> None:
    """A JSON schema over the depth / size bounds, or one the constraint compiler rejects
    (invalid, unsupported, or with keywords it would silently ignore) is a 400 now, with the
    reason. `routed`: the request left the backend to an outlines default, so a schema outlines
    cannot honour goes to llguidance (constrained/backend.py's pick_backend) and is checked
    there. Building its regex costs up to max_schema_regex_chars: call it off the event loop."""
    try:
        check_schema_bounds(schema, limits, param)  # its messages name `param`
    except ValueError as e:
        raise APIError(400, str(e), param) from None
    try:
        pick_backend(
            ConstraintSpec.create(json_schema=schema), "outlines", None if routed else "outlines"
        )
    except (ValueError, TypeError, RecursionError, OverflowError) as e:
        raise APIError(400, f"{param}: {e}", param) from None


def check_constraints(
    sp: dict[str, Any],
    limits: EngineConfig,
    prefix: str = "sampling_params.",
    backend: str = "outlines",
    routed: bool = False,
) -> None:
    """The outlines checks above (`routed`: see check_json_schema); another grammar backend
    names what it refuses when the engine takes the request (constrained/backend.py's
    check_spec: a ValueError, a 400). Every backend's constraint is bounded first by
    limits.py, in the engine's parser."""
    if backend != "outlines":
        return
    if sp.get("regex") is not None:
        check_regex(sp["regex"], f"{prefix}regex")
    if sp.get("json_schema") is not None:
        check_json_schema(sp["json_schema"], f"{prefix}json_schema", limits, routed)


def native_request(body: GenerateIn, state: ServerState) -> tuple[dict[str, Any], list[str]]:
    """The engine request dict for `body` (prompts as token ids, rids assigned) and the rids
    the engine will use. It tokenizes and builds constraints: call it off the event loop."""
    req = body.model_dump(exclude_none=True)
    for name in accept_sglang_fields(body.model_extra or {}):
        req.pop(name, None)
    if (body.text is None) == (body.input_ids is None):
        raise APIError(400, "send exactly one of 'text' or 'input_ids'", "text")
    try:  # before any prompt is tokenized or constraint read
        check_bounds(req, state.engine.config)
    except ValueError as e:
        raise APIError(400, str(e)) from None
    is_batch = isinstance(body.text, list) or (
        isinstance(body.input_ids, list)
        and bool(body.input_ids)
        and isinstance(body.input_ids[0], list)
    )
    if body.text is not None and body.input_ids is None:
        texts = body.text if isinstance(body.text, list) else [body.text]
        ids = [state.tokenize_prompt(t, "text") for t in texts]
        req.pop("text")
        req["input_ids"] = ids if is_batch else ids[0]
    prompts = _as_prompt_list(req.get("input_ids"), is_batch)
    if not prompts:  # no prompt at all: the engine names what is missing
        return req, []
    params = req.get("sampling_params")
    per_item = params if isinstance(params, list) else [params or {}] * len(prompts)
    for i, sp in enumerate(per_item):
        named = sp.get("grammar_backend")
        backend = named or state.engine.config.grammar_backend
        check_constraints(sp, state.engine.config, backend=backend, routed=named is None)
        if i < len(prompts):
            state.check_budget(
                len(prompts[i]), sp.get("max_new_tokens"), "sampling_params.max_new_tokens"
            )
    if "rid" not in req:
        base = [uuid.uuid4().hex for _ in prompts]
        req["rid"] = base if is_batch else base[0]
    bases = req["rid"] if isinstance(req["rid"], list) else [req["rid"]]
    rids: list[str] = []
    for i, base in enumerate(bases):
        n = per_item[i].get("n", 1) if i < len(per_item) else 1
        rids += [base] if n == 1 else [f"{base}-{j}" for j in range(n)]
    return req, rids


def _as_prompt_list(ids: Any, is_batch: bool) -> list[list[int]]:
    if ids is None:  # neither text nor input_ids: the engine names the problem
        return []
    return list(ids) if is_batch else [ids]
