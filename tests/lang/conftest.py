"""A scripted fake backend for the DSL tests: records every request, answers from rules.

Replies are chosen by the end of the prompt text (first matching rule, else `default`); a reply
may be a str, a list of str (for n > 1), an Exception (raised) or a callable(prompt, params).
The tokenizer is greedy longest-match over a small vocabulary, one id per other character.
Scoring requests (`input_ids` + `return_logprob`) answer from per-token-sequence tables.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

SMOLLM2_TEMPLATE = {
    "roles": {
        "system": ["<|im_start|>system\n", "<|im_end|>\n"],
        "user": ["<|im_start|>user\n", "<|im_end|>\n"],
        "assistant": ["<|im_start|>assistant\n", "<|im_end|>\n"],
    },
    "default_system_prompt": "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
}

VOCAB = ["organ", "ism", "ant", "id", "is", "est", "ablish", "ment", "arian"]
_CHAR_ID_BASE = 1000

Reply = str | list[str] | Exception | Callable[[str, dict[str, Any]], str]


class FakeBackend:
    """Implements the Backend protocol from scripted rules; thread-safe; records requests."""

    def __init__(
        self,
        rules: dict[str, Reply] | None = None,
        default: Reply = "ok",
        chat_template: dict[str, Any] | None = SMOLLM2_TEMPLATE,
        logprobs: dict[tuple[int, ...], list[float]] | None = None,
        unconditional: dict[tuple[int, ...], list[float | None]] | None = None,
        chunk_size: int = 3,
        bos_ids: list[int] | None = None,
        stream_gate: threading.Semaphore | None = None,
    ) -> None:
        self.rules = dict(rules or {})
        self.default = default
        self.chat_template = chat_template
        self.logprobs = logprobs or {}
        self.unconditional = unconditional or {}
        self.chunk_size = chunk_size
        self.bos_ids = list(bos_ids or [])
        self.stream_gate = stream_gate
        self.requests: list[dict[str, Any]] = []
        self.stream_requests: list[dict[str, Any]] = []
        self.tokenized: list[str] = []
        self.num_flushes = 0
        self._lock = threading.Lock()

    # -- the Backend protocol -----------------------------------------------------------------

    def generate(self, req: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
        with self._lock:
            self.requests.append(copy.deepcopy(req))
        if "input_ids" in req:
            return self._answer_ids(req)
        prompts = req["text"] if isinstance(req["text"], list) else [req["text"]]
        params = req.get("sampling_params") or {}
        out: list[dict[str, Any]] = []
        for prompt in prompts:
            out += self._complete(prompt, params)
        return out if isinstance(req["text"], list) or len(out) > 1 else out[0]

    def generate_stream(self, req: dict[str, Any]) -> Iterator[dict[str, Any]]:
        with self._lock:
            self.stream_requests.append(copy.deepcopy(req))
        [response] = self._complete(req["text"], req.get("sampling_params") or {})
        text = response["text"]
        for end in range(self.chunk_size, len(text), self.chunk_size):
            self._wait_for_consumer()
            yield {"text": text[:end], "meta_info": {"id": "s"}}
        self._wait_for_consumer()
        yield response

    def _wait_for_consumer(self) -> None:
        if self.stream_gate is not None:
            assert self.stream_gate.acquire(timeout=60), "the consumer never took the last chunk"

    def get_model_info(self) -> dict[str, Any]:
        return {"model_path": "fake", "chat_template": self.chat_template}

    def get_chat_template(self) -> dict[str, Any] | None:
        return self.chat_template

    def tokenize(self, text: str) -> list[int]:
        with self._lock:
            self.tokenized.append(text)
        ids, pos = list(self.bos_ids), 0
        while pos < len(text):
            match = max((t for t in VOCAB if text.startswith(t, pos)), key=len, default=None)
            if match is None:
                ids.append(_CHAR_ID_BASE + ord(text[pos]))
                pos += 1
            else:
                ids.append(VOCAB.index(match) + 1)
                pos += len(match)
        return ids

    def flush_cache(self) -> None:
        self.num_flushes += 1

    # -- scripted answers ---------------------------------------------------------------------

    def gen_requests(self) -> list[dict[str, Any]]:
        """The recorded text requests that generate (not warm-ups)."""
        with self._lock:
            return [
                r
                for r in self.requests
                if "text" in r and r["sampling_params"].get("max_new_tokens") != 0
            ]

    def _reply(self, prompt: str, params: dict[str, Any]) -> Reply:
        for suffix, reply in self.rules.items():
            if prompt.endswith(suffix):
                return reply
        return self.default

    def _complete(self, prompt: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        if params.get("max_new_tokens") == 0:
            return [_response("", len(self.tokenize(prompt)))]
        reply = self._reply(prompt, params)
        if isinstance(reply, Exception):
            raise reply
        if callable(reply):
            reply = reply(prompt, params)
        texts = reply if isinstance(reply, list) else [reply] * (params.get("n") or 1)
        return [_response(text, len(self.tokenize(prompt))) for text in texts]

    def _answer_ids(self, req: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
        batch = req["input_ids"] if isinstance(req["input_ids"][0], list) else [req["input_ids"]]
        start = req.get("logprob_start_len", -1)
        out = []
        for ids in batch:
            response = _response("", len(ids))
            if req.get("return_logprob"):
                context, scored = ids[:start], ids[start:]
                table = self.unconditional if context == self.bos_ids else self.logprobs
                values = table.get(tuple(scored), [-0.5] * len(scored))
                entries = [[lp, tok, None] for lp, tok in zip(values, scored, strict=True)]
                if start == 0:
                    entries[0][0] = None
                response["meta_info"]["input_token_logprobs"] = entries
                response["meta_info"]["output_token_logprobs"] = []
            out.append(response)
        return out if isinstance(req["input_ids"][0], list) else out[0]


def _response(text: str, prompt_tokens: int) -> dict[str, Any]:
    return {
        "text": text,
        "output_ids": [],
        "meta_info": {
            "id": "fake",
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(text),
            "cached_tokens": 0,
            "finish_reason": {"type": "stop", "matched": None},
            "e2e_latency": 0.0,
        },
    }


@pytest.fixture
def make_backend() -> Callable[..., FakeBackend]:
    """A factory: `make_backend(rules=..., default=...)` -> FakeBackend."""
    return FakeBackend


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()
