"""HF transformers as a naive DSL backend: each gen is one plain `generate` call, one at a time.

No prefix cache, no batching across programs, no constraints (a regex or JSON-schema gen raises
ValueError naming it); select scores each choice with a full forward of prefix + choice. Each
gen's meta_info carries `ttft_s`, the time to its first new token (a streamer's callback).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from .engine_bench import hf_model


class _FirstToken:
    """A streamer noting when the first new token arrives (put #2; put #1 is the prompt)."""

    def __init__(self) -> None:
        self.num_puts = 0
        self.first_at: float | None = None

    def put(self, value: torch.Tensor) -> None:
        self.num_puts += 1
        if self.num_puts == 2:
            self.first_at = time.perf_counter()

    def end(self) -> None:
        pass


class HFNaive:
    """The Backend protocol over a transformers model, every request serialized."""

    def __init__(self, model: str, dtype: str, chat_template: dict[str, Any] | None) -> None:
        from transformers import AutoTokenizer

        from ..runtime.models.loader import resolve_checkpoint

        self.model = hf_model(model, dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(str(resolve_checkpoint(model)))
        self.chat_template = chat_template
        self._lock = threading.Lock()

    def generate(self, req: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
        params = req.get("sampling_params") or {}
        if "input_ids" in req:
            return self._score(req)
        for name in ("regex", "json_schema"):
            if params.get(name):
                raise ValueError(f"HF naive: plain generate has no {name} constraint")
        texts = req["text"] if isinstance(req["text"], list) else [req["text"]]
        out = [self._generate(text, params) for text in texts]
        return out if isinstance(req["text"], list) else out[0]

    def generate_stream(self, req: dict[str, Any]):
        yield self.generate(req)

    def get_model_info(self) -> dict[str, Any]:
        return {"model_path": "hf", "chat_template": self.chat_template}

    def get_chat_template(self) -> dict[str, Any] | None:
        return self.chat_template

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    def flush_cache(self) -> None:
        pass

    def _generate(self, text: str, params: dict[str, Any]) -> dict[str, Any]:
        ids = torch.tensor([self.tokenize(text)])
        max_new = params.get("max_new_tokens") or 128
        if max_new == 0:
            return _response("", ids.shape[1], 0, None, 0.0)
        temperature = params.get("temperature") or 0.0
        stops = params.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        kwargs: dict[str, Any] = {"max_new_tokens": max_new, "do_sample": temperature > 0}
        if temperature > 0:
            kwargs |= {"temperature": temperature, "top_p": params.get("top_p") or 1.0}
        if stops:
            kwargs |= {"stop_strings": stops, "tokenizer": self.tokenizer}
        streamer = _FirstToken()
        with self._lock, torch.inference_mode():
            start = time.perf_counter()
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                streamer=streamer,
                pad_token_id=0,
                **kwargs,
            )
            latency = time.perf_counter() - start
        new_ids = out[0, ids.shape[1] :].tolist()
        text_out = self.tokenizer.decode(new_ids, skip_special_tokens=True)
        for stop in stops:
            text_out = text_out.split(stop, 1)[0]
        ttft = None if streamer.first_at is None else streamer.first_at - start
        return _response(text_out, ids.shape[1], len(new_ids), ttft, latency)

    def _score(self, req: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
        """Logprobs of prompt positions `logprob_start_len`.. by one full forward per sequence."""
        is_batch = isinstance(req["input_ids"][0], list)
        batch = req["input_ids"] if is_batch else [req["input_ids"]]
        start = max(req.get("logprob_start_len", -1), 0)
        out = []
        for ids in batch:
            response = _response("", len(ids), 0, None, 0.0)
            if req.get("return_logprob"):
                with self._lock, torch.inference_mode():
                    logits = self.model(torch.tensor([ids])).logits[0].float()
                logprobs = torch.log_softmax(logits, dim=-1)
                entries = [
                    [None if i == 0 else logprobs[i - 1, ids[i]].item(), ids[i], None]
                    for i in range(start, len(ids))
                ]
                response["meta_info"] |= {
                    "input_token_logprobs": entries,
                    "output_token_logprobs": [],
                }
            out.append(response)
        return out if is_batch else out[0]


def _response(
    text: str, prompt_tokens: int, completion_tokens: int, ttft: float | None, latency: float
) -> dict[str, Any]:
    meta = {"id": "hf", "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    meta |= {"cached_tokens": 0, "finish_reason": {"type": "stop", "matched": None}}
    meta |= {"e2e_latency": latency, "ttft_s": ttft}
    return {"text": text, "output_ids": [], "meta_info": meta}
