"""@function programs and how they run: alone, in a batch, streamed, or as an asyncio task.

A body runs on the caller's thread (run), a thread-pool worker (run_batch) or the caller's event
loop (run_async); its gens run on its state's drain thread, so many programs and fork branches
have requests in flight at once and the runtime can batch them. Keyword arguments of run() that
are not parameters of the program and are SamplingParams fields are program-level defaults.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .backend import Backend, get_default_backend, resolve_backend
from .context import RunContext, in_program
from .interpreter import Interpreter
from .ir import ProgramCall
from .requests import as_responses, warm_request
from .sampling import SAMPLING_FIELD_NAMES, SamplingParams
from .state import ProgramState
from .tracer import trace_prefix

logger = logging.getLogger(__name__)

DEFAULT_MAX_NEW_TOKENS = 128
_PER_GEN_ONLY = frozenset({"regex", "json_schema"})


class Program:
    """A function `f(s, ...)` made runnable: `f.run(...)`, `f.run_batch([...])`, `s += f(...)`."""

    def __init__(
        self,
        func: Callable[..., Any],
        num_api_spec_tokens: int | None = None,
        bound: dict[str, Any] | None = None,
    ) -> None:
        if not callable(func):
            raise TypeError(f"@function decorates a function, got {func!r}")
        params = list(inspect.signature(func).parameters.values())
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        if not params or params[0].kind not in positional:
            raise TypeError(f"a @function program takes the state `s` first; {func!r} does not")
        self.func = func
        self.is_async = inspect.iscoroutinefunction(func)
        self._params = params[1:]
        # SGLang's speculative API calls for chat APIs; no effect on a radix-cached runtime.
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bound: dict[str, Any] = dict(bound or {})
        functools.update_wrapper(self, func)
        self.__name__: str = getattr(func, "__name__", type(func).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """`f(s, ...)`: run the body on `s`. Inside a program, `f(...)`: a call for `s += f(...)`.
        Elsewhere `f(...)` is `f.run(...)`, as in SGLang."""
        if args and isinstance(args[0], ProgramState):
            return self.func(*args, **{**self.bound, **kwargs})
        if in_program.get():
            return ProgramCall(self, args, {**self.bound, **kwargs})
        return self.run(*args, **kwargs)

    def bind(self, **kwargs: Any) -> Program:
        """A copy of this program with some arguments fixed (SGLang's `SglFunction.bind`)."""
        names = {p.name for p in self._params}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(
                f"{self.__name__} has no parameter(s) {unknown}; it has {sorted(names)}"
            )
        return Program(self.func, self.num_api_spec_tokens, {**self.bound, **kwargs})

    def cache(self, backend: Backend | None = None) -> str:
        """Prefill this program's constant prefix (traced with the bound arguments) into the
        runtime's prefix cache, so later runs start with a cache hit; returns the prefix."""
        return self._warm_prefix(resolve_backend(backend))

    def call_inline(
        self, state: ProgramState, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Run this program's body on another program's state (`s += f(...)`)."""
        if not self.is_async:
            return self.func(state, *args, **kwargs)
        if _has_running_loop():
            raise TypeError(
                f"async program {self.__name__} cannot be appended with += inside an event loop; "
                f"write `await {self.__name__}(s, ...)`"
            )
        return asyncio.run(self.func(state, *args, **kwargs))

    def run(
        self,
        *args: Any,
        backend: Backend | None = None,
        stream: bool = False,
        use_thread: bool = True,
        **kwargs: Any,
    ) -> ProgramState:
        """Run once and return the state when the body returns (its last gens may still run;
        reading the state waits for them). With stream=True the body runs on its own thread
        and the state returns at once, for `text_iter`. `use_thread` is SGLang's and has no
        effect (a state's requests always run off the program's thread)."""
        program_kwargs, defaults = self._split_kwargs(kwargs)
        if self.is_async and not stream and _has_running_loop():
            raise TypeError(f"inside an event loop, use `await {self.__name__}.run_async(...)`")
        ctx = RunContext(resolve_backend(backend), defaults, is_streaming=stream)
        state = ProgramState(Interpreter(ctx))
        if stream:
            threading.Thread(
                target=self._run_body, args=(state, args, program_kwargs), daemon=True
            ).start()
            return state
        error = self._run_body(state, args, program_kwargs)
        if error is not None:
            raise error
        return state

    async def run_async(
        self, *args: Any, backend: Backend | None = None, **kwargs: Any
    ) -> ProgramState:
        """Run on the caller's event loop (an `async def` body) or a worker thread (a plain one)."""
        if not self.is_async:
            return await asyncio.to_thread(self.run, *args, backend=backend, **kwargs)
        program_kwargs, defaults = self._split_kwargs(kwargs)
        state = ProgramState(Interpreter(RunContext(resolve_backend(backend), defaults)))
        token = in_program.set(True)
        try:
            state.ret_value = await self.func(state, *args, **program_kwargs)
        except Exception as err:
            state._interp.fail(err)
            raise
        finally:
            in_program.reset(token)
            state._interp.end()
        return state

    def run_batch(
        self,
        batch_kwargs: Sequence[dict[str, Any] | Sequence[Any]],
        *,
        backend: Backend | None = None,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        generator_style: bool = False,
        **defaults: Any,
    ) -> list[ProgramState] | Iterator[ProgramState]:
        """Run once per item (a kwargs dict, or a list of positional arguments), concurrently;
        the states come back in input order, each finished. A failing item does not stop the
        others: its state holds the error. With generator_style=True an iterator yields each
        state, in input order, as soon as it and those before it are done."""
        items = [self._batch_item(item, i) for i, item in enumerate(_check_batch(batch_kwargs))]
        ctx = RunContext(resolve_backend(backend), _sampling_defaults(defaults))
        if len(items) > 1:
            self._warm_prefix(ctx.backend)
        if generator_style:
            return self._run_batch_iter(ctx, items, num_threads, progress_bar)
        return list(self._run_batch_iter(ctx, items, num_threads, progress_bar))

    def _run_batch_iter(
        self,
        ctx: RunContext,
        items: list[dict[str, Any]],
        num_threads: int | str,
        progress_bar: bool,
    ) -> Iterator[ProgramState]:
        bar = _progress_bar(len(items)) if progress_bar else None
        try:
            with ThreadPoolExecutor(_num_workers(num_threads, len(items))) as pool:
                futures = [pool.submit(self._run_item, ctx, item) for item in items]
                if bar is not None:
                    for future in futures:
                        future.add_done_callback(lambda _: bar.update(1))
                for future in futures:
                    yield future.result()
        finally:
            if bar is not None:
                bar.close()

    def _batch_item(self, item: dict[str, Any] | Sequence[Any], i: int) -> dict[str, Any]:
        """A run_batch item as keyword arguments (positional lists map onto the parameters)."""
        if isinstance(item, dict):
            return {**self.bound, **item}
        names = [p.name for p in self._params if p.kind is not p.KEYWORD_ONLY]
        names = [n for n in names if n not in self.bound]
        required = sum(1 for p in self._params if p.name in names and p.default is p.empty)
        if not required <= len(item) <= len(names):
            raise TypeError(
                f"run_batch item {i} has {len(item)} positional arguments; "
                f"{self.__name__} takes {required} to {len(names)} ({names})"
            )
        return {**self.bound, **dict(zip(names, item))}

    def trace(self, *, backend: Backend | None = None, **kwargs: Any) -> str:
        """The constant text this program starts with (up to its first gen, select, fork or
        argument-dependent part); arguments not in `kwargs` are symbolic."""
        chosen = backend if backend is not None else get_default_backend()
        return trace_prefix(self, chosen, {**self.bound, **kwargs})

    def _run_body(
        self, state: ProgramState, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Exception | None:
        """Run the body on `state`; a failure is stored on the state and returned."""
        token = in_program.set(True)
        try:
            result = self.func(state, *args, **kwargs)
            state.ret_value = asyncio.run(result) if self.is_async else result
            return None
        except Exception as err:
            state._interp.fail(err)
            return err
        finally:
            in_program.reset(token)
            state._interp.end()

    def _run_item(self, ctx: RunContext, kwargs: dict[str, Any]) -> ProgramState:
        state = ProgramState(Interpreter(ctx))
        self._run_body(state, (), kwargs)
        state._interp.wait_idle()
        return state

    def _warm_prefix(self, backend: Backend | None) -> str:
        """Prefill the program's constant prefix once (before a batch's items race for it);
        returns the prefix."""
        backend = resolve_backend(backend)
        try:
            prefix = trace_prefix(self, backend, dict(self.bound))
        except Exception as err:  # an untraceable body still runs; its errors surface per item
            logger.debug("no shared prefix traced for %s: %r", self.__name__, err)
            return ""
        if prefix:
            as_responses(backend.generate(warm_request(prefix)), 1)
        return prefix

    def _split_kwargs(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], SamplingParams]:
        """Program arguments vs program-level sampling defaults among run()'s kwargs."""
        names = {p.name for p in self._params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        takes_any = any(p.kind is p.VAR_KEYWORD for p in self._params)
        program_kwargs, sampling = dict(self.bound), {}
        for key, value in kwargs.items():
            if key in names or (takes_any and key not in SAMPLING_FIELD_NAMES):
                program_kwargs[key] = value
            else:
                sampling[key] = value
        return program_kwargs, _sampling_defaults(sampling)

    def __repr__(self) -> str:
        return f"<stemma program {self.__name__}>"


def function(
    func: Callable[..., Any] | None = None, *, num_api_spec_tokens: int | None = None
) -> Any:
    """Decorator making `func(s, ...)` a Program (also usable as `@function()` and, as in SGLang,
    `@function(num_api_spec_tokens=N)`, which has no effect here)."""
    if func is None:
        return functools.partial(Program, num_api_spec_tokens=num_api_spec_tokens)
    return Program(func, num_api_spec_tokens)


def _sampling_defaults(values: dict[str, Any]) -> SamplingParams:
    unknown = sorted(set(values) - SAMPLING_FIELD_NAMES)
    if unknown:
        raise TypeError(
            f"unexpected keyword argument(s) {unknown}: neither program parameters nor "
            f"sampling defaults ({', '.join(sorted(SAMPLING_FIELD_NAMES - _PER_GEN_ONLY))})"
        )
    per_gen = sorted(set(values) & _PER_GEN_ONLY)
    if per_gen:
        raise TypeError(f"{per_gen} constrain one gen; pass them to gen(...), not run()")
    return SamplingParams(**{"max_new_tokens": DEFAULT_MAX_NEW_TOKENS, **values})


def _check_batch(batch_kwargs: Any) -> list[Any]:
    if isinstance(batch_kwargs, dict | str) or not isinstance(batch_kwargs, Sequence):
        kind = type(batch_kwargs).__name__
        raise TypeError(f"run_batch takes a list of kwargs dicts, got a {kind}")
    for i, item in enumerate(batch_kwargs):
        if not isinstance(item, dict | list | tuple):
            raise TypeError(
                f"run_batch item {i} must be a dict of arguments or a list of positional "
                f"arguments, got {item!r}"
            )
    return list(batch_kwargs)


def _num_workers(num_threads: int | str, num_items: int) -> int:
    if num_threads == "auto":
        num_threads = max(96, (os.cpu_count() or 1) * 16)
    if not isinstance(num_threads, int) or isinstance(num_threads, bool) or num_threads < 1:
        raise ValueError(f"num_threads must be 'auto' or an int >= 1, got {num_threads!r}")
    return max(1, min(num_threads, num_items))


def _progress_bar(total: int) -> Any:
    """A tqdm bar, or None where tqdm is not installed."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total)


def _has_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
