"""The engine thread's loop (Engine's, runtime/engine.py): drain the inbox, run one step of
the engine core, hand each advanced request's output to its caller; a failing batch fails its
requests, never the loop; a lost tensor-parallel rank fails everything in flight and refuses
what comes after.
"""

from __future__ import annotations

import logging
import queue
import threading

from .executor.tensor_parallel import WorkerLost
from .inbox import AbortRequest, AddRequests, CallOnEngine, Command, Stop
from .scheduler.req import FinishReason, Req

log = logging.getLogger("stemma.engine")


class EngineLoop:
    """What runs on the engine thread once the model is loaded. Engine builds the state it
    reads: scheduler, core, outbox, responses, metrics, heap, the inbox and its gate."""

    def _loop(self) -> None:
        while True:
            busy = self.scheduler.has_work
            if not busy and self.heap.steps_since_trim:
                self.heap.release()  # idle: return the last steps' temporaries to the OS
            if not self._drain_inbox(block=not busy):
                break
            if not self.scheduler.has_work:
                continue
            try:
                batch = self.core.step()
                advanced = batch.rejected + batch.reqs
            except WorkerLost as e:  # the group is broken: nothing can run any more
                self._on_rank_lost(str(e))
                advanced = []
            except Exception as e:  # noqa: BLE001 - fail the batch's requests, keep serving
                log.exception("engine step failed")
                advanced = self._fail_batch(f"engine error: {type(e).__name__}: {e}")
            ran = self.core.batch is not None and bool(self.core.batch.reqs)
            if not ran and not advanced:
                self._idle_wait()  # waiting requests cannot start yet (e.g. grammar compiling)
            else:
                self.heap.after_step()
            self.metrics.on_step(self.core.batch)
            self._emit(advanced)
            if self.check_invariants:
                self.scheduler.check_memory()
        self._abort_all("the engine shut down")

    def _idle_wait(self, seconds: float = 0.005) -> None:
        try:
            self._apply_now(self._inbox.get(timeout=seconds))
        except queue.Empty:
            pass

    def _apply_now(self, cmd: Command) -> None:
        """Apply one command now (the loop drains the rest next round)."""
        if isinstance(cmd, Stop):
            self._inbox.put(cmd)
        else:
            self._apply(cmd)

    def _drain_inbox(self, block: bool) -> bool:
        """Apply queued commands; False once asked to stop. Consecutive aborts are applied
        together, in one pass over the queues (a disconnect may abort a whole batch)."""
        try:
            cmd = self._inbox.get(timeout=None) if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        aborts: dict[str, str] = {}
        while True:
            if isinstance(cmd, AbortRequest):
                aborts.setdefault(cmd.rid, cmd.message)
            else:
                self._abort_many(aborts)  # before the next command: the order stands
                aborts = {}
                if isinstance(cmd, Stop):
                    return False
                self._apply(cmd)
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                self._abort_many(aborts)
                return True

    def _abort_many(self, messages: dict[str, str]) -> None:
        if messages:
            self._emit(self.scheduler.abort_many(messages))

    def _apply(self, cmd: Command) -> None:
        if isinstance(cmd, AddRequests):
            request, reqs, sink = cmd.request, cmd.reqs, cmd.sink
            self._gate.moved(-len(reqs))
            for idx, req in enumerate(reqs):
                refused = self.unavailable or f"duplicate rid {req.rid!r}"
                if self.unavailable or req.rid in self.outbox.handles:
                    req.finish = FinishReason.abort(refused)
                    sink((idx, self.responses.build(req, ""), True))
                    continue
                self.outbox.open(req, idx, sink, request.stream)
                self.scheduler.add(req)
                self.metrics.on_arrival(req)
        elif isinstance(cmd, AbortRequest):
            req = self.scheduler.abort(cmd.rid, cmd.message)
            if req is not None:
                self._emit([req])
        elif isinstance(cmd, CallOnEngine):
            try:
                cmd.reply((True, cmd.fn()))
            except Exception as e:  # noqa: BLE001 - handed to the caller, who raises it
                cmd.reply((False, e))

    def _emit(self, reqs: list[Req]) -> None:
        for req in reqs:
            if (reason := self.outbox.emit(req)) is not None:
                self._apply(AbortRequest(req.rid, reason))

    def _on_rank_lost(self, message: str) -> None:
        """Refuse new requests, fail all in flight (the watchdog hands it to the loop)."""
        self.unavailable = message
        if threading.current_thread() is self._thread:
            self._abort_all(f"engine error: {message}")
        else:
            self._inbox.put(CallOnEngine(lambda: self._on_rank_lost(message), lambda _: None))

    def _fail_batch(self, message: str) -> list[Req]:
        """Abort the failed step's requests (every running one if it failed while deciding);
        returns them with the step's rejections, which are finished already."""
        batch = self.core.batch
        reqs = list(batch.reqs) if batch is not None else list(self.scheduler.running)
        failed = [r for r in (self.scheduler.abort(r.rid, message) for r in reqs) if r is not None]
        return (batch.rejected if batch is not None else []) + failed

    def _abort_all(self, message: str) -> None:
        queues = list(self.scheduler.running) + list(self.scheduler.waiting)
        self._abort_many({req.rid: message for req in queues})
