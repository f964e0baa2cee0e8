"""Engine: the in-process serving runtime. Callers submit /generate-shaped requests from any
thread (or asyncio task); one engine thread runs the scheduler loop and pushes each request's
outputs to its caller. A failing batch fails its requests, never the loop.

The engine thread also loads the model (the constructor waits for it), so every parallel
region of the engine's torch work runs on that one thread. torch's CPU ops run parallel
regions through OpenMP, and libgomp keeps a team of worker threads for each thread that ever
opened one, for as long as that thread lives. A load on the caller's thread would leave the
caller's team idle beside the engine thread's: more OpenMP threads than cores, so libgomp
stops spinning at barriers and every region of a step waits on a futex instead. That cost
single-stream decode half its speed (bench/results/engine_thread.jsonl).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from .config import EngineConfig
from .constrained.constraints import Constraints
from .constrained.pattern_example import schema_examples
from .constrained.service import default_grammar_cache_dir
from .constrained.vocabulary import CompileLimits
from .cpu_caches import HeapTrimmer, bound_onednn_caches
from .dtype_policy import resolve_dtype
from .engine_core import build_core, load_runner
from .engine_loop import EngineLoop
from .engine_state import (
    EngineMetrics,
    EngineUnavailable,
    EventBuffer,
    QueueGate,
    events_until_final,
    final_outputs,
    stream_outputs,
)
from .executor.tensor_parallel import TensorParallel
from .faults import Faults
from .inbox import AbortRequest, AddRequests, CallOnEngine, Command, Event, Stop
from .io_struct import GenerateRequest, check_prompt
from .models.loader import resolve_checkpoint
from .outbox import Outbox
from .response import ResponseBuilder
from .sampling.sampler import SamplingState
from .scheduler.req import Req
from .scheduler.stop import StopSpec, compile_stops

DEFAULT_MODEL = "smollm2-135m"


class Engine(EngineLoop):
    def __init__(self, model: str | None = None, *, model_path: str | None = None, **config: Any):
        """`model` (or SGLang's name for it, `model_path`): a built-in name, HF directory or
        GGUF file; the default is the built-in smollm2-135m."""
        if model is not None and model_path is not None and model != model_path:
            raise ValueError(f"got model={model!r} and model_path={model_path!r}; give one")
        model = model or model_path or DEFAULT_MODEL
        bound_onednn_caches()  # before anything below runs a oneDNN matmul
        self.config = cfg = EngineConfig.from_kwargs(model=model, **config)
        if cfg.num_threads or (cfg.tp_size > 1 and cfg.device == "cpu"):
            torch.set_num_threads(cfg.num_threads or 1)  # one per rank: ranks share the cores
        self.unavailable: str | None = None  # why new requests are refused, once they are
        self.tp: TensorParallel | None = None
        started: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._run, args=(cfg, started.put), name="stemma-engine", daemon=True
        )
        self._thread.start()
        if (error := started.get()) is not None:
            self._thread.join()
            raise error

    # ---- engine thread: start -------------------------------------------------------------
    def _run(self, cfg: EngineConfig, started: Callable[[BaseException | None], None]) -> None:
        """The engine thread's life: load (the constructor waits), then serve until Stop."""
        try:
            self._start(cfg)
        except BaseException as e:  # noqa: BLE001 - the constructor raises it
            started(e)
            return
        started(None)
        self._loop()

    def _start(self, cfg: EngineConfig) -> None:
        # An explicit dtype this CPU runs slowly is measured: here, as every other matmul.
        self.dtype = resolve_dtype(cfg.dtype, cfg.device)
        # A GGUF converts once, before any worker starts.
        ckpt = resolve_checkpoint(cfg.model, Path(cfg.cache_dir) if cfg.cache_dir else None)
        try:
            if cfg.tp_size > 1:
                self.tp = TensorParallel(cfg, str(ckpt), self.dtype.torch_dtype)
            self._load(cfg, str(ckpt))
        except BaseException:
            if self.tp is not None:
                self.tp.shutdown()
            raise

    def _load(self, cfg: EngineConfig, ckpt: str) -> None:
        """Load rank 0's model (TP workers load theirs meanwhile) and everything the loop
        reads."""
        self.faults = Faults(cfg.enable_fault_injection)
        loaded, self.runner, plan = load_runner(cfg, ckpt, self.dtype, self.faults, self.tp)
        self.dtype = self.dtype.noting(plan.reason)
        self.tokenizer = loaded.tokenizer
        if cfg.chat_template is not None:
            self.tokenizer.set_chat_template(cfg.chat_template)
        self.model_config = loaded.config
        if self.tp is not None:
            self.tp.wait_ready(plan)
            self.tp.on_lost = self._on_rank_lost
        self.vocab_size = loaded.config.vocab_size
        self.core = build_core(cfg, self.runner, self.tokenizer, self.vocab_size)
        self.scheduler, self.outputs = self.core.scheduler, self.core.outputs
        limits = CompileLimits(
            timeout_s=cfg.grammar_timeout_s, max_index_bytes=cfg.grammar_max_index_mb << 20
        )
        grammar = Path(cfg.cache_dir) / "grammar" if cfg.cache_dir else default_grammar_cache_dir()
        self.constraints = Constraints(
            self.tokenizer, grammar, limits, self.faults, cfg.grammar_backend
        )
        self.responses = ResponseBuilder(self.tokenizer)
        self.metrics = EngineMetrics()
        self.outbox = Outbox(self.tokenizer, self.responses, self.metrics)
        self.heap = HeapTrimmer()  # hands freed heap pages back to the OS (cpu_caches.py)
        self.check_invariants = False  # tests turn this on: check_memory() after every step
        self._inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._gate = QueueGate()

    # ---- public API -----------------------------------------------------------------------
    def generate(self, text=None, sampling_params=None, input_ids=None, **fields: Any):
        """Blocking /generate; with stream=True an iterator of cumulative chunks."""
        request, reqs = self._prepare(text, input_ids, sampling_params, fields)
        if request.stream:
            return self._stream_sync(request, reqs)
        events: queue.SimpleQueue = queue.SimpleQueue()
        self._submit(request, reqs, events.put)
        return final_outputs(iter(events.get, None), len(request.items), request.is_batch)

    async def async_generate(self, text=None, sampling_params=None, input_ids=None, **fields):
        """Awaitable /generate; with stream=True returns an async iterator of chunks."""
        # Tokenizing and building a constraint's regex take up to their bounds (limits.py);
        # a worker thread spends them, so the caller's event loop keeps answering.
        request, reqs = await asyncio.to_thread(
            self._prepare, text, input_ids, sampling_params, fields
        )
        if request.stream:
            return self._stream_async(request, reqs)
        results: list[Any] = [None] * len(reqs)
        async for idx, out, is_final in self._events_async(request, reqs):
            if is_final:
                results[idx] = out
        return results if request.is_batch else results[0]

    def generate_stream(self, text=None, sampling_params=None, input_ids=None, **fields):
        return self.generate(text, sampling_params, input_ids, stream=True, **fields)

    async def async_generate_stream(self, text=None, sampling_params=None, input_ids=None, **kw):
        stream = await self.async_generate(text, sampling_params, input_ids, stream=True, **kw)
        async for chunk in stream:
            yield chunk

    def abort(self, rid: str, message: str = "aborted by the caller") -> None:
        self._inbox.put(AbortRequest(rid, message))

    def flush_cache(self) -> None:
        """Empty the radix cache; raises RuntimeError while requests run."""
        self._call(self.scheduler.flush_cache)

    def get_model_info(self) -> dict[str, Any]:
        tok = self.tokenizer
        return {
            "model_path": self.config.model,
            "is_generation": True,
            "tp_size": self.config.tp_size,
            "dtype": self.dtype.name,
            "dtype_reason": self.dtype.reason,
            "quantization": self.config.quantization,
            "weights_note": self.runner.weights_note,
            "weight_measurements": self.runner.measurements,  # kept across starts: measured.py
            "speculative_algorithm": self.config.speculative_algorithm,
            "torch_compile_s": (  # the start's compile (or cache load), executor/compiled.py
                round(compiled.compile_s, 2)
                if (compiled := self.runner.model.compiled) is not None
                else None
            ),
            "torch_compile_note": self.runner.compile_note,
            "torch_compile_package": (  # the one-row step's, executor/compiled_aot.py
                {"path": str(single.path), "from_cache": not single.built}
                if compiled is not None and (single := compiled._single) is not None
                else None
            ),
            "torch_compile_drafts_package": (  # one request's drafts' (2 to max_tokens)
                {
                    "path": str(drafts.path),
                    "from_cache": not drafts.built,
                    "max_tokens": drafts.max_tokens,
                }
                if compiled is not None and (drafts := compiled._drafts) is not None
                else None
            ),
            "torch_compile_batch_package": (  # decode steps of 2 to max_tokens requests
                {
                    "path": str(batch.path),
                    "from_cache": not batch.built,
                    "max_tokens": batch.max_tokens,
                }
                if compiled is not None and (batch := compiled._batch) is not None
                else None
            ),
            "max_context_length": self.runner.context_len,
            "vocab_size": self.vocab_size,
            "eos_token_ids": sorted(tok.eos_token_ids),
            "chat_template": roles.to_dict() if (roles := tok.chat_roles()) else None,
        }

    def get_metrics(self) -> dict[str, Any]:
        return self._call(lambda: self.metrics.snapshot(self.scheduler))

    def memory_state(self) -> dict[str, Any]:
        """KV slots by owner (free, evictable, locked, private), request rows, and whether the
        slot invariant holds now (taken between steps)."""
        return self._call(self.scheduler.memory_state)

    def inject_fault(self, kind: str, count: int = 1) -> dict[str, dict[str, int]]:
        """Arm a test-only fault switch (runtime/faults.py); RuntimeError when injection is
        off. Returns the switches' state."""
        self.faults.arm(kind, count)
        return self.faults.state()

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt, tools)

    def shutdown(self) -> None:
        """Abort what is still running, stop the engine thread and any TP workers."""
        if self._thread.is_alive():
            self._inbox.put(Stop())
            self._thread.join()
        self.constraints.close()
        if self.tp is not None:
            self.tp.shutdown()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- caller side ----------------------------------------------------------------------
    def _prepare(self, text, input_ids, sampling_params, fields) -> tuple[GenerateRequest, list]:
        if self.unavailable is not None:
            raise EngineUnavailable(f"{self.unavailable}; the engine accepts no new requests")
        d = {"text": text, "input_ids": input_ids, "sampling_params": sampling_params, **fields}
        request = GenerateRequest.from_dict(d, self.config)
        cfg, items = self.config, request.items
        self._gate.check(len(self.scheduler.waiting), len(items), cfg.max_queued_requests)
        stops = compile_stops([item.params for item in items], cfg.max_stop_regex_states)
        return request, [self._make_req(item, stop) for item, stop in zip(items, stops)]

    def _make_req(self, item, stop: StopSpec | None) -> Req:
        ids = item.input_ids if item.input_ids is not None else self.tokenizer.encode(item.text)
        runner = self.runner
        check_prompt(item, ids, runner.context_len, runner.allocator.capacity, self.vocab_size)
        p = item.params
        p.check_vocab(self.vocab_size)
        state = SamplingState.create(p, ids, self.vocab_size)
        req = Req(item.rid, list(ids), p, state, item.logprob, namespace=item.namespace)
        req.stop = stop.matcher(self.tokenizer) if stop is not None else None
        req.grammar_handle = self.constraints.submit(p)
        if p.closes_early and p.json_schema is not None:
            req.closing_examples = schema_examples(p.json_schema)
        return req

    def _submit(self, request: GenerateRequest, reqs: list[Req], sink: Callable) -> None:
        self._gate.moved(len(reqs))
        self._inbox.put(AddRequests(request, reqs, sink))

    def _stream_sync(self, request, reqs) -> Iterator[dict[str, Any]]:
        events = EventBuffer()  # submitted at the first read, as the generator starts
        self._submit(request, reqs, events.put)
        yield from stream_outputs(events, reqs, request.is_batch, self.abort)

    async def _events_async(self, request, reqs) -> AsyncIterator[Event]:
        events = EventBuffer(asyncio.get_running_loop())
        self._submit(request, reqs, events.put)
        async for ev in events_until_final(events, reqs, self.abort):
            yield ev

    async def _stream_async(self, request, reqs) -> AsyncIterator[dict[str, Any]]:
        async for idx, out, _ in self._events_async(request, reqs):
            yield out | {"index": idx} if request.is_batch else out

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run fn on the engine thread (between steps) and return its result."""
        if threading.current_thread() is self._thread:
            return fn()
        done: queue.SimpleQueue = queue.SimpleQueue()
        self._inbox.put(CallOnEngine(fn, done.put))
        ok, value = done.get()
        if not ok:
            raise value
        return value
