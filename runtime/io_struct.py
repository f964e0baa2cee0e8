"""The /generate request at the edge: a dict (or kwargs) parsed into GenerateItems.

Mirrors SGLang's GenerateReqInput: exactly one of text / input_ids, each single or a list
(a batch); sampling_params a dict or a list of dicts, and so are return_logprob,
logprob_start_len and top_logprobs_num (one value per prompt); `n` > 1 fans one prompt out to
n items. `cache_salt` (vLLM's name) puts every item in the prefix-cache namespace of that
string: requests share cached K/V only with the same salt (or with none), so one tenant
cannot tell from `cached_tokens` what another has sent.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Any

from ..lang.sampling_table import REQUEST_PARAMS
from .config import EngineConfig
from .limits import check_bounds
from .sampling.params import SamplingParams
from .scheduler.req import LogprobRequest

REQUEST_FIELDS = (
    "text",
    "input_ids",
    "sampling_params",
    "rid",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "token_ids_logprob",
    "return_text_in_logprobs",
    "stream",
    "cache_salt",
)
MAX_CACHE_SALT_CHARS = 1024

DEFAULT_LIMITS = EngineConfig()


@dataclass(slots=True)
class GenerateItem:
    rid: str
    text: str | None
    input_ids: list[int] | None
    params: SamplingParams
    logprob: LogprobRequest
    namespace: bytes | None = None  # the radix namespace: sha256 of cache_salt, if any


@dataclass(slots=True)
class GenerateRequest:
    items: list[GenerateItem]
    is_batch: bool  # the caller sent lists, or n > 1: answer with a list
    stream: bool

    @staticmethod
    def from_dict(d: dict[str, Any], limits: EngineConfig = DEFAULT_LIMITS) -> GenerateRequest:
        """Parse one request (null values mean "not set"), bounded first by `limits`' max_*
        fields (runtime/limits.py)."""
        d = {k: v for k, v in d.items() if v is not None}
        unknown = sorted(set(d) - set(REQUEST_FIELDS))
        if unknown:
            raise ValueError(f"unknown request field(s) {unknown}; allowed: {list(REQUEST_FIELDS)}")
        text, ids = d.get("text"), d.get("input_ids")
        if (text is None) == (ids is None):
            raise ValueError("send exactly one of 'text' or 'input_ids'")
        check_bounds(d, limits)
        prompts, is_batch = _prompts(text, ids)
        params = _per_item(d.get("sampling_params"), len(prompts), "sampling_params")
        rids = _per_item(d.get("rid"), len(prompts), "rid")
        if d.get("token_ids_logprob") is not None:
            raise ValueError("token_ids_logprob is not supported yet; use top_logprobs_num")
        logprobs = _logprob_requests(d, len(prompts))
        namespace = _salt_namespace(d.get("cache_salt"))
        parsed = [SamplingParams.from_dict(p) for p in params]
        items = []
        for i, prompt in enumerate(prompts):
            logprob, sp = logprobs[i], parsed[i]
            base = rids[i] if rids[i] is not None else uuid.uuid4().hex
            if not isinstance(base, str):
                raise TypeError(f"rid must be a string, got {type(base).__name__}")
            for j in range(sp.n):
                rid = base if sp.n == 1 else f"{base}-{j}"
                is_text = isinstance(prompt, str)
                items.append(
                    GenerateItem(
                        rid,
                        prompt if is_text else None,
                        None if is_text else prompt,
                        sp,
                        logprob,
                        namespace,
                    )
                )
        stream = d.get("stream", False)
        if not isinstance(stream, bool):
            raise TypeError(f"stream must be a bool, got {stream!r}")
        return GenerateRequest(items, is_batch or len(items) > len(prompts), stream)


def check_prompt(
    item: GenerateItem, ids: list[int], context_len: int, kv_slots: int, vocab_size: int
) -> None:
    """ValueError unless the item's prompt ids fit the engine: non-empty, shorter than the
    context and the KV pool, inside the vocabulary, and longer than logprob_start_len."""
    if not ids:
        raise ValueError("the prompt is empty")
    if len(ids) >= context_len:
        raise ValueError(f"the prompt has {len(ids)} tokens; the context length is {context_len}")
    if len(ids) >= kv_slots:
        raise ValueError(
            f"the prompt has {len(ids)} tokens; the KV pool holds {kv_slots} "
            "(raise kv_cache_mb or max_total_tokens)"
        )
    if max(ids) >= vocab_size:
        raise ValueError(f"input_ids contain {max(ids)}, outside the vocabulary ({vocab_size})")
    if item.logprob.logprob_start_len >= len(ids):
        raise ValueError(
            f"logprob_start_len={item.logprob.logprob_start_len} is not below the prompt "
            f"length {len(ids)}"
        )


def _salt_namespace(salt: Any) -> bytes | None:
    """The radix namespace of a cache_salt: its SHA-256 (fixed size, whatever the salt)."""
    if salt is None:
        return None
    if not isinstance(salt, str):
        raise TypeError(f"cache_salt must be a string, got {type(salt).__name__}")
    if not 0 < len(salt) <= MAX_CACHE_SALT_CHARS:
        raise ValueError(
            f"cache_salt has {len(salt)} characters; it needs 1 to {MAX_CACHE_SALT_CHARS}"
        )
    return hashlib.sha256(salt.encode("utf-8", "surrogatepass")).digest()


def _prompts(text: Any, ids: Any) -> tuple[list[str | list[int]], bool]:
    if text is not None:
        if isinstance(text, str):
            return [text], False
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return list(text), True
        raise TypeError("text must be a string or a non-empty list of strings")
    if isinstance(ids, list) and ids and all(_is_id(t) for t in ids):
        return [list(ids)], False
    if (
        isinstance(ids, list)
        and ids
        and all(isinstance(x, list) and x and all(_is_id(t) for t in x) for x in ids)
    ):
        return [list(x) for x in ids], True
    raise TypeError("input_ids must be a non-empty list of token ids or a list of such lists")


def _is_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0


def _per_item(value: Any, num: int, name: str) -> list[Any]:
    if isinstance(value, list):
        if len(value) != num:
            raise ValueError(f"{name} is a list of {len(value)} but the batch has {num} prompts")
        return value
    return [value] * num


_LOGPROB_FIELDS = ("return_logprob", "logprob_start_len", "top_logprobs_num")


def _logprob_requests(d: dict[str, Any], num: int) -> list[LogprobRequest]:
    """One LogprobRequest per prompt; each logprob field is one value or one per prompt."""
    per_field = {name: _per_item(d.get(name), num, name) for name in _LOGPROB_FIELDS}
    return [
        _logprob_request({**d, **{name: values[i] for name, values in per_field.items()}})
        for i in range(num)
    ]


def _logprob_request(d: dict[str, Any]) -> LogprobRequest:
    def get(name: str, default: Any) -> Any:
        return default if d.get(name) is None else REQUEST_PARAMS[name].check(d[name])

    return LogprobRequest(
        return_logprob=get("return_logprob", False),
        logprob_start_len=get("logprob_start_len", -1),
        top_logprobs_num=get("top_logprobs_num", 0),
        return_text_in_logprobs=get("return_text_in_logprobs", False),
    )
