"""ProgramState, the `s` a program appends to, and ProgramStateGroup, the branches of a fork.

`s += x` submits and returns at once; reads (`s["x"]`, `s.text()`) block until their value is
there, and raise the state's error if it failed. In `async def` programs the `a*` forms
(`await s.aget("x")`, `await s.atext()`) wait without blocking the event loop.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

from .interpreter import Interpreter
from .ir import (
    ConcatAndAppend,
    Expr,
    ExprList,
    ProgramCall,
    VarScopeBegin,
    VarScopeEnd,
    flatten,
    role_expr,
)

JOIN_MODES = ("gather_variable", "concate_and_append")


class ProgramState:
    """The running state of one program: its text, captured variables and chat messages."""

    def __init__(self, interp: Interpreter) -> None:
        self._interp = interp
        self.ret_value: Any = None

    def __iadd__(self, other: Expr | str) -> ProgramState:
        for node in flatten(other):
            if isinstance(node, ProgramCall):
                node.program.call_inline(self, node.args, node.kwargs)
            else:
                self._interp.submit(node)
        return self

    def __getitem__(self, name: str) -> Any:
        return self._interp.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self._interp.set_var(name, value)

    def __contains__(self, name: object) -> bool:
        """Whether variable `name` is set (waits for queued work that sets it; never raises)."""
        return isinstance(name, str) and self._interp.has_var(name)

    def get_var(self, name: str) -> Any:
        """The captured value of `name`, waiting for it if it is still being generated."""
        return self._interp.get_var(name)

    def set_var(self, name: str, value: Any) -> None:
        self._interp.set_var(name, value)

    def get_meta_info(self, name: str) -> Any:
        """The runtime's meta info for the gen/select `name` (tokens, finish reason, logprobs)."""
        return self._interp.get_meta_info(name)

    def text(self) -> str:
        """The whole text so far, once everything submitted has run."""
        self._interp.sync()
        return self._interp.text

    def messages(self) -> list[dict[str, str]]:
        """The chat messages so far: [{"role": ..., "content": ...}]."""
        self._interp.sync()
        return [dict(m) for m in self._interp.messages]

    def sync(self) -> None:
        """Wait until everything submitted has run; raise the state's error if it failed. On a
        program's first state this includes every fork's work, read or not."""
        if self._interp.is_root:
            self._interp.sync_run()
        else:
            self._interp.sync()

    def error(self) -> BaseException | None:
        """The exception this state failed with, if any (never blocks, never raises)."""
        return self._interp.error

    def fork(
        self, n: int = 1, position_ids_offset: Sequence[int] | None = None
    ) -> ProgramStateGroup:
        """n branches starting from this state's text (prefilled on the runtime once).

        `position_ids_offset` is SGLang's argument (one int per branch); it is checked and has
        no effect: every branch continues at its true positions.
        """
        _check_position_ids_offset(position_ids_offset, n)
        self._interp.prepare_fork(n)
        self._interp.sync()
        return ProgramStateGroup([ProgramState(i) for i in self._interp.spawn(n)], self)

    @contextmanager
    def copy(self, position_ids_offset: Sequence[int] | None = None) -> Iterator[ProgramState]:
        """`with s.copy() as c:` a one-branch fork, joined (gather_variable) when the block ends:
        variables new in `c` become one-item lists in `s`."""
        group = self.fork(1, position_ids_offset)
        try:
            yield group[0]
        finally:
            group.join()

    def system(self, expr: Expr | str | None = None) -> Any:
        return self._role("system", expr)

    def user(self, expr: Expr | str | None = None) -> Any:
        return self._role("user", expr)

    def assistant(self, expr: Expr | str | None = None) -> Any:
        return self._role("assistant", expr)

    def _role(self, role: str, expr: Expr | str | None) -> Any:
        """With `expr`: append the message. Without: a context manager for `with s.user(): ...`."""
        if expr is not None:
            self += role_expr(role, expr)
            return None
        return self._role_scope(role)

    @contextmanager
    def _role_scope(self, role: str) -> Iterator[None]:
        begin, end = role_expr(role, None).exprs
        self += begin
        yield
        self += end

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """Capture everything appended inside the block as variable `name`."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"var_scope needs a non-empty str name, got {name!r}")
        self += VarScopeBegin(name)
        yield
        self += VarScopeEnd(name)

    def text_iter(self, var: str | None = None) -> Iterator[str]:
        """Yield new text as it arrives (of the whole state, or of variable `var`) until done."""
        offset = 0
        while True:
            chunk, is_done = self._interp.next_chunk(var, offset)
            offset += len(chunk)
            if chunk:
                yield chunk
            if is_done:
                return

    async def text_async_iter(self, var: str | None = None) -> AsyncIterator[str]:
        """`text_iter` for `async for`: waits without blocking the event loop."""
        offset = 0
        while True:
            ready = functools.partial(self._interp.chunk_ready, var, offset)
            await self._interp.wait_async(ready)
            chunk, is_done = self._interp.take_chunk(var, offset)
            offset += len(chunk)
            if chunk:
                yield chunk
            if is_done:
                return

    async def aget(self, name: str) -> Any:
        """`s[name]` for async programs."""
        await self._interp.wait_async(lambda: self._interp.var_ready(name))
        return self._interp.get_var(name)

    async def atext(self) -> str:
        """`s.text()` for async programs."""
        await self.wait()
        return self._interp.text

    async def wait(self) -> None:
        """`s.sync()` for async programs."""
        await self._interp.wait_async(self._interp.is_idle)
        self._interp.sync()

    async def afork(self, n: int) -> ProgramStateGroup:
        """`s.fork(n)` for async programs."""
        self._interp.prepare_fork(n)
        await self.wait()
        return ProgramStateGroup([ProgramState(i) for i in self._interp.spawn(n)], self)

    def __repr__(self) -> str:
        return f"ProgramState({self._interp.text!r})"


def _check_position_ids_offset(offsets: Sequence[int] | None, n: int) -> None:
    if offsets is None:
        return
    if (
        isinstance(offsets, str)
        or not isinstance(offsets, Sequence)
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
    ):
        raise TypeError(f"position_ids_offset must be a list of ints, got {offsets!r}")
    if len(offsets) != n:
        raise ValueError(f"position_ids_offset has {len(offsets)} entries for {n} branches")


class ProgramStateGroup:
    """The branches of `s.fork(n)`; each is a ProgramState. `join()` brings results back."""

    def __init__(self, states: list[ProgramState], parent: ProgramState) -> None:
        self.states = states
        self.parent = parent

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        """What `forks[i] += x` stores back: the same branch (`+=` appends in place)."""
        if value is not self.states[i]:
            raise TypeError("a fork's branch cannot be replaced; append to it with `forks[i] += x`")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(
        self, other: Expr | str | Sequence[Expr | str] | Callable[[int], Expr | str]
    ) -> ProgramStateGroup:
        """Append to every branch: one expr to all, a list (one per branch) or `lambda i: ...`."""
        if isinstance(other, list | tuple) and not isinstance(other, ExprList):
            if len(other) != len(self.states):
                raise ValueError(f"got {len(other)} expressions for {len(self.states)} branches")
            for state, item in zip(self.states, other, strict=True):
                state += item
        elif callable(other) and not isinstance(other, Expr):
            for i, state in enumerate(self.states):
                state += other(i)
        else:
            for state in self.states:
                state += cast(Expr | str, other)
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """Bring the branches back into the parent.

        gather_variable: each variable new in the branches becomes, in the parent, the list of
        the branches' values (waits for the branches). concate_and_append: the text each branch
        added is appended to the parent, in branch order (queued like any append).
        """
        if mode not in JOIN_MODES:
            raise ValueError(f"join mode must be one of {JOIN_MODES}, got {mode!r}")
        branches = [state._interp for state in self.states]
        if mode == "concate_and_append":
            self.parent += ConcatAndAppend(branches)
        else:
            for branch in branches:
                branch.sync()
            self._gather(branches)
        for branch in branches:
            branch.end()

    async def ajoin(self, mode: str = "gather_variable") -> None:
        """`join` for async programs: waits for the branches without blocking the loop."""
        for state in self.states:
            await state.wait()
        self.join(mode)

    def _gather(self, branches: list[Interpreter]) -> None:
        parent = self.parent._interp
        parent_names = set(parent.variables)
        new_names: list[str] = []
        for branch in branches:
            new_names += [n for n in branch.variables if n not in parent_names | set(new_names)]
        for name in new_names:
            parent.set_var(name, [branch.variables.get(name) for branch in branches])
