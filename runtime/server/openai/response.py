"""OpenAI response bodies built from the engine's /generate outputs: choices, finish reasons,
logprobs (chat and legacy completions formats) and usage.

Items are prompt-major: choice k is prompt k // n, sample k % n. Usage counts each prompt once
and reports, per prompt, the most of it any of its samples found in the cache.
"""

from __future__ import annotations

from typing import Any

from ..errors import APIError, abort_status

FINISH_REASONS = {"stop": "stop", "length": "length"}


def finish_reason(meta: dict[str, Any]) -> str | None:
    finish = meta.get("finish_reason")
    return None if finish is None else FINISH_REASONS.get(finish["type"], finish["type"])


def raise_if_aborted(outs: list[dict[str, Any]]) -> None:
    for out in outs:
        finish = out["meta_info"]["finish_reason"]
        if finish is not None and finish["type"] == "abort":
            message = finish.get("message") or "the request was aborted"
            raise APIError(abort_status(message), message)


def usage(metas: list[dict[str, Any]], n: int) -> dict[str, Any]:
    prompt = cached = 0
    for start in range(0, len(metas), n):
        group = metas[start : start + n]
        prompt += group[0]["prompt_tokens"]
        cached += max(m["cached_tokens"] for m in group)
    completion = sum(m["completion_tokens"] for m in metas)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _token(entry: list[Any]) -> str:
    return entry[2] if entry[2] is not None else ""


def chat_logprobs(meta: dict[str, Any], start: int, end: int) -> dict[str, Any]:
    """OpenAI chat `logprobs` for output tokens [start, end)."""
    entries = meta.get("output_token_logprobs", [])[start:end]
    tops = meta.get("output_top_logprobs", [])[start:end]
    content = []
    for k, entry in enumerate(entries):
        top = tops[k] if k < len(tops) else []
        content.append(
            {
                "token": _token(entry),
                "logprob": entry[0],
                "bytes": list(_token(entry).encode()),
                "top_logprobs": [
                    {"token": _token(t), "logprob": t[0], "bytes": list(_token(t).encode())}
                    for t in top
                ],
            }
        )
    return {"content": content}


def completion_logprobs(
    entries: list[list[Any]], tops: list[Any] | None, offset: int
) -> dict[str, Any]:
    """The legacy completions `logprobs` for `entries`; text offsets start at `offset`."""
    offsets = []
    for entry in entries:
        offsets.append(offset)
        offset += len(_token(entry))
    top_dicts = None
    if tops is not None:
        top_dicts = [None if top is None else {_token(t): t[0] for t in top} for top in tops]
    return {
        "tokens": [_token(e) for e in entries],
        "token_logprobs": [e[0] for e in entries],
        "top_logprobs": top_dicts,
        "text_offset": offsets,
    }


def completion_choice(
    index: int, out: dict[str, Any], echo: str | None, top_n: int | None
) -> dict[str, Any]:
    meta = out["meta_info"]
    prefix = echo or ""
    logprobs = None
    if top_n is not None:
        entries = meta["output_token_logprobs"]
        tops = meta.get("output_top_logprobs") if top_n > 0 else None
        if echo is not None:
            entries = meta["input_token_logprobs"] + entries
            if tops is not None:
                tops = meta["input_top_logprobs"] + tops
        logprobs = completion_logprobs(entries, tops, 0)
    return {
        "index": index,
        "text": prefix + out["text"],
        "logprobs": logprobs,
        "finish_reason": finish_reason(meta),
        "matched_stop": meta["finish_reason"].get("matched"),
    }


def chat_choice(
    index: int, out: dict[str, Any], tool_calls: list[dict[str, Any]] | None, want_logprobs: bool
) -> dict[str, Any]:
    meta = out["meta_info"]
    message: dict[str, Any] = {"role": "assistant", "content": out["text"], "refusal": None}
    reason = finish_reason(meta)
    if tool_calls:
        message["content"] = None
        message["tool_calls"] = tool_calls
        reason = "tool_calls"
    logprobs = chat_logprobs(meta, 0, len(out["output_ids"])) if want_logprobs else None
    return {
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": reason,
        "matched_stop": meta["finish_reason"].get("matched"),
    }
