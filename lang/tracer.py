"""Symbolic tracing: run a program with placeholder arguments to find its constant prefix.

The prefix is the text a program appends before its first gen, select, fork or argument-dependent
part; run_batch prefills it once so every item of a batch starts with a prefix-cache hit.
Python side effects in the body before that point run once more while tracing.
"""

from __future__ import annotations

import inspect
from collections.abc import Coroutine
from typing import Any, NoReturn

from .backend import Backend
from .context import RunContext, StopTrace, in_program
from .interpreter import Interpreter
from .ir import Expr
from .state import ProgramState


class Argument(Expr):
    """Stands for an argument trace() was not given; any use of its value stops the trace.

    Appending it (`s += arg`, `"Q: " + arg`) stops the trace at that point; formatting it,
    reading an attribute or comparing it stops the trace where that happens.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Argument({self.name!r})"

    def _stop(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise StopTrace

    def __getattr__(self, name: str) -> NoReturn:
        raise StopTrace

    __str__ = __format__ = __bool__ = __len__ = __iter__ = __contains__ = _stop
    __getitem__ = __int__ = __float__ = __index__ = __hash__ = _stop
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _stop
    __mul__ = __rmul__ = __mod__ = __call__ = _stop


def trace_prefix(program: Any, backend: Backend | None, kwargs: dict[str, Any]) -> str:
    """The constant prefix of `program` given the arguments in `kwargs` (others symbolic).

    Without a backend the trace also stops at the first role (the chat template is unknown).
    """
    interp = Interpreter(RunContext(backend=backend, is_tracing=True))
    args, bound = _bind(program.func, kwargs)
    token = in_program.set(True)
    try:
        result = program.func(ProgramState(interp), *args, **bound)
        if inspect.iscoroutine(result):
            _drive(result)
    except StopTrace:
        pass  # the text stopped being constant: what was appended so far is the prefix
    finally:
        in_program.reset(token)
    return interp.text


def _bind(func: Any, kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """Positional and keyword arguments for `func` after the state: given, default or symbolic."""
    args: list[Any] = []
    bound: dict[str, Any] = {}
    for param in list(inspect.signature(func).parameters.values())[1:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.name in kwargs:
            value = kwargs[param.name]
        elif param.default is not param.empty:
            value = param.default
        else:
            value = Argument(param.name)
        if param.kind is param.POSITIONAL_ONLY:
            args.append(value)
        else:
            bound[param.name] = value
    bound.update({k: v for k, v in kwargs.items() if k not in bound})
    return args, bound


def _drive(coro: Coroutine[Any, Any, Any]) -> None:
    """Run an async body up to its first real suspension (it awaits nothing of ours there)."""
    try:
        coro.send(None)
    except StopIteration:
        return
    coro.close()
