"""Outbox: where each request's outputs go, on the engine thread. A request admitted with a
caller gets a Handle (its item index, the caller's sink, a stream's text state); after each
step the outbox turns every advanced request into its caller's event: the final output once
it finished, else a cumulative chunk when a stream has new tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .engine_state import EngineMetrics, Handle
from .inbox import Event
from .response import ResponseBuilder, StreamText, final_text
from .scheduler.req import FinishReason, Req
from .tokenizer import IncrementalDetokenizer, Tokenizer

log = logging.getLogger("stemma.engine")


class Outbox:
    def __init__(self, tokenizer: Tokenizer, responses: ResponseBuilder, metrics: EngineMetrics):
        self.tokenizer, self.responses, self.metrics = tokenizer, responses, metrics
        self.handles: dict[str, Handle] = {}

    def open(self, req: Req, index: int, sink: Callable[[Event], None], stream: bool) -> None:
        detok = IncrementalDetokenizer(self.tokenizer, req.params.skip_special_tokens)
        self.handles[req.rid] = Handle(index, sink, StreamText(detok) if stream else None)

    def emit(self, req: Req) -> str | None:
        """Hand `req`'s event to its caller, if it has one; returns why the request must be
        aborted now (its response could not be built, or its caller went away), else None."""
        if (handle := self.handles.get(req.rid)) is None:
            return None
        try:
            event = self._event(req, handle)
        except Exception as e:  # noqa: BLE001 - this request fails; the loop goes on
            log.exception("request %s: building its response failed", req.rid)
            req.finish = FinishReason.abort(f"engine error: {e!r}")
            del self.handles[req.rid]
            self._deliver(handle, req, (handle.index, self.responses.failed(req), True))
            return req.finish.message
        if event is not None and not self._deliver(handle, req, event) and req.finish is None:
            return "the caller's event loop closed"
        return None

    def _event(self, req: Req, handle: Handle) -> Event | None:
        event = None
        if req.finish is not None:
            out = self.responses.build(req, final_text(self.tokenizer, req))
            del self.handles[req.rid]
            self.metrics.on_finish(req)
            event = (handle.index, out, True)
        elif handle.stream is not None and len(req.output_ids) > handle.stream.num_ids:
            text = handle.stream.update(req)
            event = (handle.index, self.responses.build(req, text), False)
        if req.output_ids and req.first_token_time is None:
            self.metrics.on_first_token(req)
        return event

    @staticmethod
    def _deliver(handle: Handle, req: Req, event: Event) -> bool:
        """False when nobody listens any more (the caller's event loop is closed)."""
        try:
            handle.sink(event)
        except RuntimeError:
            log.warning("request %s: caller went away; aborting it", req.rid)
            return False
        return True
