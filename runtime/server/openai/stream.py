"""Streaming for the OpenAI routes: engine chunks (cumulative text, one item per choice) become
`chat.completion.chunk` / `text_completion` deltas.

Each choice sends only what it has not sent. A choice that may still turn out to be a tool call
holds its text back (see openai/tools.py) and sends it, or the call, when it finishes. The last
event of a choice carries its finish_reason; with stream_options.include_usage a final event
with no choices carries the usage; a failed request sends one error event; `[DONE]` ends all.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from ..errors import abort_status, error_dict
from ..state import SSE_DONE, ServerState, sse
from .response import chat_logprobs, completion_logprobs, finish_reason, usage
from .tools import ToolPlan, could_become_tool_call, parse_tool_calls


@dataclass(slots=True)
class StreamSpec:
    """What the stream's envelope needs: ids, names, counts and options."""

    object: str  # "chat.completion.chunk" | "text_completion"
    id: str
    model: str
    n: int  # samples per prompt, for usage
    include_usage: bool
    created: int = field(default_factory=lambda: int(time.time()))

    def envelope(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }


@dataclass(slots=True)
class ChatChoiceStream:
    index: int
    plan: ToolPlan
    want_logprobs: bool
    sent: str = ""
    num_logprobs: int = 0  # output tokens whose logprobs were sent
    started: bool = False

    def deltas(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        if not self.started:
            self.started = True
            out.append(self._choice({"role": "assistant", "content": ""}, None, None))
        text, meta = chunk["text"], chunk["meta_info"]
        reason = finish_reason(meta)
        if reason is None:
            if self._holding(text):
                return out
            delta = text[len(self.sent) :]
            logprobs = self._logprobs(meta, len(chunk["output_ids"]))
            if delta or logprobs:
                self.sent = text
                out.append(self._choice({"content": delta}, logprobs, None))
            return out
        calls = parse_tool_calls(text, self.plan.names) if self.plan.mode != "none" else None
        logprobs = self._logprobs(meta, len(chunk["output_ids"]))
        if calls:
            tool_deltas = [{"index": k, **call} for k, call in enumerate(calls)]
            out.append(self._choice({"tool_calls": tool_deltas}, logprobs, "tool_calls"))
        else:
            delta = text[len(self.sent) :] if text.startswith(self.sent) else ""
            out.append(self._choice({"content": delta} if delta else {}, logprobs, reason))
        return out

    def _holding(self, text: str) -> bool:
        if self.plan.mode == "forced":
            return True
        return self.plan.mode == "auto" and not self.sent and could_become_tool_call(text)

    def _logprobs(self, meta: dict[str, Any], num_ids: int) -> dict[str, Any] | None:
        if not self.want_logprobs or num_ids <= self.num_logprobs:
            return None
        start, self.num_logprobs = self.num_logprobs, num_ids
        return chat_logprobs(meta, start, num_ids)

    def _choice(self, delta: dict[str, Any], logprobs: Any, reason: str | None) -> dict[str, Any]:
        return {"index": self.index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}


@dataclass(slots=True)
class CompletionChoiceStream:
    index: int
    echo: str | None  # prompt text to send first
    top_n: int | None  # None: no logprobs
    sent: str = ""
    num_logprobs: int = 0
    started: bool = False

    def deltas(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        text, meta = chunk["text"], chunk["meta_info"]
        reason = finish_reason(meta)
        prefix = ""
        entries: list[list[Any]] = []
        tops: list[Any] = []
        if not self.started:
            self.started = True
            if self.echo is not None:
                prefix = self.echo
                entries = list(meta.get("input_token_logprobs", []))
                tops = list(meta.get("input_top_logprobs", []))
        num_ids = len(chunk["output_ids"])
        if self.top_n is not None and num_ids > self.num_logprobs:
            entries += meta["output_token_logprobs"][self.num_logprobs : num_ids]
            tops += meta.get("output_top_logprobs", [])[self.num_logprobs : num_ids]
            self.num_logprobs = num_ids
        delta = text[len(self.sent) :] if text.startswith(self.sent) else ""
        self.sent = text if text.startswith(self.sent) else self.sent
        if not (prefix or delta or entries or reason):
            return []
        logprobs = None
        if self.top_n is not None:
            logprobs = completion_logprobs(entries, tops if self.top_n > 0 else None, 0)
        return [
            {
                "index": self.index,
                "text": prefix + delta,
                "logprobs": logprobs,
                "finish_reason": reason,
            }
        ]


async def openai_events(
    state: ServerState,
    chunks: AsyncIterator[dict[str, Any]],
    rids: list[str],
    spec: StreamSpec,
    choices: list[Any],
    route: str,
    start: float,
) -> AsyncIterator[bytes]:
    """Server-sent events for one OpenAI streaming request; `choices` are *ChoiceStreams."""
    metas: dict[int, dict[str, Any]] = {}  # choice index -> final meta_info
    stopped: str | None = "the client disconnected"  # None once every choice finished
    try:
        async with aclosing(chunks):  # type: ignore[type-var]
            async for chunk in chunks:
                finish = chunk["meta_info"]["finish_reason"]
                if finish is not None and finish["type"] == "abort":
                    stopped = finish.get("message") or "the request was aborted"
                    yield sse(error_dict(abort_status(stopped), stopped))
                    break
                for choice in choices[chunk.get("index", 0)].deltas(chunk):
                    yield sse(spec.envelope([choice], usage=None))
                if finish is not None:
                    metas[chunk.get("index", 0)] = chunk["meta_info"]
            else:
                stopped = None
        if spec.include_usage and stopped is None:
            ordered = [metas[k] for k in sorted(metas)]
            yield sse(spec.envelope([], usage=usage(ordered, spec.n)))
        yield SSE_DONE
    finally:
        state.release(rids)
        state.log_batch(route, list(metas.values()), start, stopped)
