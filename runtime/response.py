"""Response dicts in SGLang's /generate shape, built from a Req on the engine thread.

Streaming text is cumulative and never shows a stop string or a prefix of one that may still
complete; the final text is decoded whole and trimmed at the stop string (unless no_stop_trim).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .scheduler.req import FinishKind, Req
from .scheduler.stop import StopPrefixes
from .tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass(slots=True)
class StreamText:
    """Cumulative decoded text of a streaming request."""

    detok: IncrementalDetokenizer
    text: str = ""
    num_ids: int = 0
    held: StopPrefixes | None = None  # what of the text a stop string may be starting

    def update(self, req: Req) -> str:
        new = req.output_ids[self.num_ids :]
        self.num_ids = len(req.output_ids)
        self.text += self.detok.push(new)
        if not req.params.stop:
            return self.text
        if self.held is None:
            self.held = StopPrefixes(req.params.stop)
        return self.text[: self.held.shown(self.text)]


def final_text(tokenizer: Tokenizer, req: Req) -> str:
    text = tokenizer.decode(req.output_ids, req.params.skip_special_tokens)
    f = req.finish
    if f is not None and f.kind is FinishKind.STOP and isinstance(f.matched, str):
        if not req.params.no_stop_trim:
            idx = text.find(f.matched)
            text = text[:idx] if idx >= 0 else text
    return text


def _lp_list(tok: Tokenizer, pairs: list, with_text: bool) -> list[list[Any]]:
    return [[lp, tid, tok.decode([tid], False) if with_text else None] for lp, tid in pairs]


@dataclass(slots=True)
class ResponseBuilder:
    tokenizer: Tokenizer
    start_time: float = field(default_factory=time.monotonic)

    def build(self, req: Req, text: str) -> dict[str, Any]:
        meta = self.meta(req)
        if req.logprob.return_logprob:
            tok, with_text = self.tokenizer, req.logprob.return_text_in_logprobs
            meta["input_token_logprobs"] = _lp_list(tok, req.input_logprobs, with_text)
            meta["output_token_logprobs"] = _lp_list(tok, req.output_logprobs, with_text)
            if req.logprob.top_logprobs_num > 0:
                meta["input_top_logprobs"] = [
                    None if top is None else _lp_list(tok, top, with_text)
                    for top in req.input_top_logprobs
                ]
                meta["output_top_logprobs"] = [
                    _lp_list(tok, top, with_text) for top in req.output_top_logprobs
                ]
        return {"text": text, "output_ids": list(req.output_ids), "meta_info": meta}

    def failed(self, req: Req) -> dict[str, Any]:
        """The final response of a request whose own response could not be built: its
        finish reason and counts, no text or logprobs (the part that failed)."""
        return {"text": "", "output_ids": list(req.output_ids), "meta_info": self.meta(req)}

    @staticmethod
    def meta(req: Req) -> dict[str, Any]:
        meta = {
            "id": req.rid,
            "prompt_tokens": len(req.input_ids),
            "completion_tokens": len(req.output_ids),
            "cached_tokens": req.cached_tokens,
            "finish_reason": req.finish.to_dict() if req.finish else None,
            "e2e_latency": time.monotonic() - req.arrival_time,
        }
        if req.finish is not None and req.finish.closed_early:
            meta["closed_early"] = True  # constrained/closing.py: valid, ended at the budget
        if req.num_draft_tokens and req.num_decode_steps:  # drafts verified: SGLang's keys
            meta["spec_verify_ct"] = req.num_decode_steps
            meta["spec_num_proposed_drafts"] = req.num_draft_tokens
            meta["spec_num_correct_drafts"] = req.num_forced_tokens
            meta["spec_accept_rate"] = req.num_forced_tokens / req.num_draft_tokens
            meta["spec_accept_length"] = len(req.output_ids) / req.num_decode_steps
        return meta
