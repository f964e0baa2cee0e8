"""Runs one program state: its expressions execute in submission order, off the program's thread.

`submit` returns at once (SGLang semantics); `get_var` and `sync` block until what they need is
done. A drain thread runs while work is queued and exits when the queue empties, so an idle state
holds no thread. The first failure is stored, later queued work is skipped, and every later read
raises it: a reader never waits for a request that will not come.
Invariants (under `_cond`): `_pending` counts submitted expressions not yet finished or skipped;
`_unresolved[name]` counts those among them that will set variable `name`.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from .backend import Backend
from .constraints import parse_value
from .context import RunContext, StopTrace
from .ir import (
    CachePrefix,
    ConcatAndAppend,
    Constant,
    Expr,
    Gen,
    RoleBegin,
    RoleEnd,
    Select,
    VarScopeBegin,
    VarScopeEnd,
)
from .requests import as_responses, check_response, gen_request, warm_request
from .scoring import score_select

# What a traced program may append while its text is still constant.
_CONSTANT_NODES = (Constant, RoleBegin, RoleEnd, VarScopeBegin, VarScopeEnd)


class Interpreter:
    """The text, variables and messages of one program state, and the queue that builds them."""

    def __init__(self, ctx: RunContext, parent: Interpreter | None = None) -> None:
        self.ctx = ctx
        self.text: str = parent.text if parent else ""
        self.variables: dict[str, Any] = dict(parent.variables) if parent else {}
        self.meta_info: dict[str, Any] = dict(parent.meta_info) if parent else {}
        self.messages: list[dict[str, str]] = [dict(m) for m in parent.messages] if parent else []
        self.role: str | None = parent.role if parent else None
        self.fork_start = len(self.text)
        self.error: BaseException | None = None
        self.is_ended = False
        self._role_start: int = parent._role_start if parent else 0
        self._scope_start: dict[str, int] = dict(parent._scope_start) if parent else {}
        self._var_text: dict[str, str] = dict(parent._var_text) if parent else {}
        self._queue: deque[Expr] = deque()
        self._pending = 0
        self._unresolved: Counter[str] = Counter()
        self._is_draining = False
        self.is_root = parent is None
        # Every state of the run, forks included (one list shared down the tree; sync_run).
        self.run_states: list[Interpreter] = parent.run_states if parent else []
        self.run_states.append(self)
        self._cond = threading.Condition()
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    # -- called by the program (any thread) ---------------------------------------------------

    def submit(self, node: Expr) -> None:
        """Queue `node`; it runs after everything submitted before it."""
        if self.ctx.is_tracing:
            if not isinstance(node, _CONSTANT_NODES):
                raise StopTrace
            self._execute(node)
            return
        with self._cond:
            if self.is_ended:
                raise RuntimeError("this program state has ended; nothing more can be appended")
            self._pending += 1
            self._unresolved.update(_defined_names(node))
            self._queue.append(node)
            if not self._is_draining:
                self._is_draining = True
                threading.Thread(target=self._drain, name="stemma-state", daemon=True).start()

    def get_var(self, name: str) -> Any:
        """The value of `name`, once every queued expression that sets it has run."""
        self.stop_if_tracing()
        with self._cond:
            self._cond.wait_for(lambda: self.var_ready(name))
            return self._read(self.variables, name)

    def has_var(self, name: str) -> bool:
        """Whether `name` is set, once queued work that sets it has run (never raises)."""
        self.stop_if_tracing()
        with self._cond:
            self._cond.wait_for(lambda: self.var_ready(name))
            return name in self.variables

    def get_meta_info(self, name: str) -> Any:
        self.stop_if_tracing()
        with self._cond:
            self._cond.wait_for(lambda: self.var_ready(name))
            if self.error is None and name in self.variables and name not in self.meta_info:
                return None
            return self._read(self.meta_info, name)

    def set_var(self, name: str, value: Any) -> None:
        with self._cond:
            self.variables[name] = value
            self._var_text[name] = str(value)
            self._changed()

    def sync(self) -> None:
        """Wait for everything submitted so far; raise the state's error if it failed."""
        if self.ctx.is_tracing:
            return
        with self._cond:
            self._cond.wait_for(self.is_idle)
            if self.error is not None:
                raise self.error

    def wait_idle(self) -> None:
        """Wait until nothing is queued or running, without raising."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending == 0)

    def sync_run(self) -> None:
        """`sync`, after waiting for every other state of the run (forks nobody read or joined
        included), so no request of the program is still running when it returns."""
        if not self.ctx.is_tracing:
            for state in list(self.run_states):
                if state is not self:
                    state.wait_idle()
        self.sync()

    def end(self) -> None:
        """Mark that the program will submit nothing more (streams then know when to stop)."""
        with self._cond:
            self.is_ended = True
            self._changed()

    def fail(self, err: BaseException) -> None:
        """Store `err` as this state's error (the first one wins)."""
        with self._cond:
            if self.error is None:
                self.error = err
            self._changed()

    def prepare_fork(self, n: int) -> None:
        """Validate `n` and queue the prefill of the shared prefix (only worth it for n > 1)."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"fork needs an int n >= 1, got {n!r}")
        self.stop_if_tracing()
        if n > 1:
            self.submit(CachePrefix())

    def spawn(self, n: int) -> list[Interpreter]:
        """n children copying this state as it is now (call after `sync`)."""
        with self._cond:
            return [Interpreter(self.ctx, parent=self) for _ in range(n)]

    def stop_if_tracing(self) -> None:
        if self.ctx.is_tracing:
            raise StopTrace

    # -- readiness, as predicates for blocking and async waits (call under `_cond`) -----------

    def var_ready(self, name: str) -> bool:
        return self.error is not None or self._unresolved[name] <= 0

    def is_idle(self) -> bool:
        return self.error is not None or self._pending == 0

    def chunk_ready(self, var: str | None, offset: int) -> bool:
        return len(self._view(var)) > offset or self._view_done(var)

    def next_chunk(self, var: str | None, offset: int) -> tuple[str, bool]:
        """Block until text past `offset` (of the whole text, or of `var`) or the end; return
        (new text, whether nothing more will come)."""
        with self._cond:
            self._cond.wait_for(lambda: self.chunk_ready(var, offset))
            return self.take_chunk(var, offset)

    def take_chunk(self, var: str | None, offset: int) -> tuple[str, bool]:
        with self._cond:
            if self.error is not None:
                raise self.error
            return self._view(var)[offset:], self._view_done(var)

    async def wait_async(self, ready: Callable[[], bool]) -> None:
        """Await `ready()` (evaluated under the lock) without blocking the event loop."""
        self.stop_if_tracing()
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        with self._cond:
            self._async_waiters.append(waiter)
        try:
            while True:
                with self._cond:
                    if ready():
                        return
                    waiter[1].clear()
                await waiter[1].wait()
        finally:
            with self._cond:
                self._async_waiters.remove(waiter)

    def _view(self, var: str | None) -> str:
        return self.text if var is None else self._var_text.get(var, "")

    def _view_done(self, var: str | None) -> bool:
        finished = self.error is not None or (self.is_ended and self._pending == 0)
        if var is None:
            return finished
        return finished or (var in self.variables and self._unresolved[var] <= 0)

    def _read(self, table: dict[str, Any], name: str) -> Any:
        if self.error is not None:
            raise self.error
        if name not in table:
            raise KeyError(f"no variable {name!r} in this program state; it has {sorted(table)}")
        return table[name]

    def _changed(self) -> None:
        self._cond.notify_all()
        for loop, event in self._async_waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(event.set)

    # -- execution (the drain thread) ---------------------------------------------------------

    def _drain(self) -> None:
        while True:
            with self._cond:
                if not self._queue:
                    self._is_draining = False
                    return
                node = self._queue.popleft()
                is_skipped = self.error is not None
            if not is_skipped:
                try:
                    self._execute(node)
                except BaseException as err:  # stored and raised to every reader of this state
                    self.fail(err)
            with self._cond:
                self._pending -= 1
                self._unresolved.subtract(_defined_names(node))
                self._changed()

    def _execute(self, node: Expr) -> None:
        if isinstance(node, Constant):
            self._append(node.text)
        elif isinstance(node, Gen):
            self._run_gen(node)
        elif isinstance(node, Select):
            choice, meta = score_select(self.ctx, self.text, node)
            self._append(choice)
            self._set_result(node.name, choice, meta, choice)
        elif isinstance(node, RoleBegin):
            self._role_begin(node.role)
        elif isinstance(node, RoleEnd):
            self._role_end(node.role)
        elif isinstance(node, VarScopeBegin):
            self._scope_start[node.name] = len(self.text)
        elif isinstance(node, VarScopeEnd):
            if node.name not in self._scope_start:
                raise ValueError(f"var_scope {node.name!r} ended without beginning")
            value = self.text[self._scope_start.pop(node.name) :]
            self._set_result(node.name, value, None, value)
        elif isinstance(node, CachePrefix):
            if self.text:
                as_responses(self.ctx.require_backend().generate(warm_request(self.text)), 1)
        elif isinstance(node, ConcatAndAppend):
            for branch in node.branches:
                branch.sync()
            self._append("".join(b.text[b.fork_start :] for b in node.branches))
        else:
            raise TypeError(f"cannot execute {node!r}")

    def _run_gen(self, node: Gen) -> None:
        params = node.params.merged(self.ctx.defaults)
        if self.role == "assistant":
            # The gen ends where the template ends the turn; EOS ends it too where that differs.
            stop = self.ctx.chat_template().assistant_stop
            params = params.with_extra_stop(stop) if stop else params
        backend = self.ctx.require_backend()
        n = params.n or 1
        if n == 1 and self.ctx.is_streaming:
            text, meta = self._stream_gen(backend, gen_request(self.text, params, True), node.name)
            self._set_result(node.name, parse_value(text, node.dtype), meta, text)
            return
        responses = as_responses(backend.generate(gen_request(self.text, params)), n)
        if n == 1:
            text = responses[0]["text"]
            self._append(text)
            value = parse_value(text, node.dtype)
            self._set_result(node.name, value, responses[0]["meta_info"], text)
            return
        # n samples are captured as a list; none is appended, the program picks what to append.
        values = [parse_value(r["text"], node.dtype) for r in responses]
        self._set_result(node.name, values, [r["meta_info"] for r in responses], "")

    def _stream_gen(
        self, backend: Backend, req: dict[str, Any], name: str | None
    ) -> tuple[str, dict[str, Any]]:
        seen, meta = "", dict[str, Any]()
        for chunk in backend.generate_stream(req):
            check_response(chunk)
            text = chunk.get("text", "")
            with self._cond:
                self.text += text[len(seen) :]
                if name is not None:
                    self._var_text[name] = text
                self._changed()
            seen = text
            meta = chunk.get("meta_info") or meta
        return seen, meta

    def _role_begin(self, role: str) -> None:
        if self.role is not None:
            raise ValueError(f"role {role!r} begun inside role {self.role!r}; roles do not nest")
        template = self.ctx.chat_template()
        prefix, _ = template.markers(role)
        if not self.messages and role != "system" and template.default_system_prompt:
            self._role_begin("system")
            self._append(template.default_system_prompt)
            self._role_end("system")
        self._append(prefix)
        self.role, self._role_start = role, len(self.text)

    def _role_end(self, role: str) -> None:
        if self.role != role:
            raise ValueError(f"role {role!r} ended while role {self.role!r} is open")
        content = self.text[self._role_start :]
        self._append(self.ctx.chat_template().markers(role)[1])
        self.messages.append({"role": role, "content": content})
        self.role = None

    def _append(self, text: str) -> None:
        with self._cond:
            self.text += text
            self._changed()

    def _set_result(self, name: str | None, value: Any, meta: Any, raw_text: str) -> None:
        if name is None:
            return
        with self._cond:
            self.variables[name] = value
            self._var_text[name] = raw_text
            if meta is not None:
                self.meta_info[name] = meta
            self._changed()


def _defined_names(node: Expr) -> list[str]:
    """The variables running `node` sets."""
    if isinstance(node, Gen | Select) and node.name is not None:
        return [node.name]
    if isinstance(node, VarScopeEnd):
        return [node.name]
    return []
