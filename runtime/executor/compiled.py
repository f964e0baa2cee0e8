"""The compiled step (SGLang's `--enable-torch-compile`): a decode step compiled whole by
PyTorch Inductor, from the embedding to the final norm, attention and the K/V writes
included; the vocabulary projection runs eager after it.

An eager batch-1 step is about 1,100 operator calls, of which the 120 matmuls take half the
time; the norms, RoPE, casts, views, K/V writes and attention around them, each a Python call
and a dispatch, take the other half. Compiled, they become a few fused kernels per layer
around the same weight forms' kernels, run without Python in between.

The graph (decode_graph.py) attends over the decode batch's dense K/V copy
(attention.DecodeKV), which it appends this step's K/V to as it writes them into the pool,
each token masked past its own position: its shapes then change only with the tokens, the
requests and the copy's capacity, which are symbolic, so one graph serves every context
length. A step that verifies drafts (a constraint's forced text, prompt lookup's) is the
same graph with several tokens per request, each attending over its request's row of the
copy, so drafts and the compiled step go together, and the copy's run goes on past them
(positions a cut draft wrote stay masked until written over). Steps it does not take run
eager: prefills, steps over a shared prefix (cascade), steps of more tokens than it takes,
and batches the dense copy does not hold (over its budget).

A one-row step runs the same graph compiled ahead of time (compiled_aot.py: no Dynamo
guards, no Python between its kernels), and so do decode steps of a few requests and one
request's drafts, each up to the first row limit past one where a linear changes kernel (a
second and a third package, the count symbolic); Dynamo's graph takes the steps of more
requests and those verifying several requests' drafts, the row count symbolic from two rows
on, and one request's longer drafts in a specialization of its own (Dynamo fixes a size of
one).
`warm_up` builds them all at start: each span of row counts between the limits where a
linear changes form (weights/few_rows.py) is compiled at its last count, then at its first,
so that a graph Inductor's cache holds for a narrower span (from a start whose limits
differed) cannot leave the span's other counts to a compile inside a step. Where the one-row
package cannot be built, Dynamo's graph takes one row too, specialized. oneDNN-packed
bfloat16, an opaque tensor Dynamo cannot trace, is multiplied through ops that name each
weight by number (weights/dense.py), so larger steps compile too; a form Inductor cannot
trace (WeightForm.compiles) caps the rows the graph takes below the rows it multiplies, and
so does a size that fails to compile. One request's drafts attend by two batched matmuls
over its row of the copy (decode_graph.draft_attention), which read it once for all the
draft's tokens.
Inductor caches the compiled code on disk (`cache_dir`; the packages beside it, in `aot/`,
at most compiled_aot.KEPT_BYTES of them), so a later start loads it.
"""

from __future__ import annotations

import logging
import sys
import time
import types
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch._inductor.config
from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

from ..models.layers import compiled_row_limit, form_row_limits
from .attention import TorchAttnBackend
from .compiled_aot import MIN_CAPACITY, PackagedStep, build_package, inputs, prune_packages
from .decode_graph import decode_graph, unguarded_model
from .forward_batch import ForwardBatch, ForwardMode
from .memory import KVPool

if TYPE_CHECKING:
    from ..models.decoder import DecoderForCausalLM

log = logging.getLogger("stemma.engine")
RECOMPILE_LIMIT = 64  # Dynamo's per-function limit: one graph per row bucket stays inside it
# The dense copy's capacity in the warm-up's example. Its size is symbolic, but Inductor
# plans its loops by the example's size (which to run on every core, which to vectorize):
# a tiny one had every attention loop run on one core.
WARM_UP_CAPACITY = 512
# The most requests the package of decode steps takes (below a row limit that ends it first).
# Its saving is per step (Dynamo's guards, the Python between kernels: about 2.5 ms of a
# batch-8 SmolLM2 step on a 2-core AMD EPYC), a smaller share as rows grow, while its example,
# a dense copy of WARM_UP_CAPACITY positions per request, grows with them.
BATCH_PACKAGE_ROWS = 8


class CompiledDecode:
    def __init__(self, model: DecoderForCausalLM, max_rows: int, drafts: bool = False) -> None:
        """drafts: whether one request's drafts are verified through the graph too (its own
        compiles at start: the request's row of the copy a constant). Raises ValueError where
        no step could compile (a form Inductor cannot lower)."""
        self.model, self.max_rows = model, max_rows
        self.verifies_one_request = drafts  # warm_up turns it off where that fails to compile
        self.note: str | None = None  # what the graph leaves to eager steps, when it does
        limit = compiled_row_limit(model.layers)
        if limit == 0:
            raise ValueError("Inductor cannot trace their matmul")
        if limit is not None and limit < max_rows:
            self.max_rows = limit
            self.note = (
                f"decode steps of <= {limit} rows compiled; larger ones run eager (their "
                "linears' form cannot be compiled)"
            )
        # A function of its own: Dynamo keeps compiled graphs per code object, and these
        # graphs are this model's alone (they do not guard on it; see unguarded_model).
        own = types.FunctionType(decode_graph.__code__.replace(), decode_graph.__globals__)
        options = {"guard_filter_fn": unguarded_model}
        self._step = torch.compile(own, fullgraph=True, options=options)
        self.compile_s = 0.0  # warm_up's compile (or cache load) time
        self._run: list[torch.Tensor] | None = None  # the dense copy's K of the run it started
        self.aot_dir: Path | None = None  # where the packages are kept (build sets it)
        self._single: PackagedStep | None = None  # the one-row step (compiled_aot.py)
        self._drafts: PackagedStep | None = None  # one request's drafts (compiled_aot.py)
        self._batch: PackagedStep | None = None  # decode steps of a few requests (the same)

    def forward(
        self, fb: ForwardBatch, pool: KVPool, attn: TorchAttnBackend
    ) -> torch.Tensor | None:
        """The step's logits, or None for a step this graph does not take (run it eager)."""
        if not isinstance(attn, TorchAttnBackend) or attn.dense is None:
            return None
        logits = self._forward(fb, pool, attn)
        if logits is None and fb.mode is not ForwardMode.DECODE:
            attn.decode_kv.drop()  # the eager step that verifies drafts does not write the copy
        return logits

    def _forward(self, fb: ForwardBatch, pool: KVPool, attn: TorchAttnBackend):
        decode = fb.mode is ForwardMode.DECODE
        if fb.num_tokens > self.max_rows or (decode and fb.logits_idx.shape[0] != fb.batch_size):
            return None
        if not decode and fb.batch_size == 1 and not self.verifies_one_request:
            return None  # its graph was not compiled (Dynamo would compile inside the step)
        dense = attn.decode_kv
        if attn.dense == "start":
            if not dense.start_all(pool, self.model.dtype):
                return None
            for buffer in (*dense.k, *dense.v):  # one graph for every capacity
                torch._dynamo.mark_dynamic(buffer, 1)
            self._run = dense.k
        elif dense.k is not self._run:  # a run an eager step started: its copy is unmarked
            return None
        args = (fb.input_ids, fb.positions, dense.token_rows, attn.out_loc, dense.flat_pos)
        kv = (pool.k, pool.v, dense.k, dense.v)
        package = self._package(fb, decode) if dense.capacity >= MIN_CAPACITY else None
        if package is not None:
            hidden = package(inputs(*args, *kv))
        else:
            hidden = self._step(self.model, *args, *kv)
        if not decode:  # the rows whose logits are asked for (a draft's every token)
            hidden = hidden.index_select(0, fb.logits_idx)
        return self.model.project(hidden)

    def _package(self, fb: ForwardBatch, decode: bool) -> PackagedStep | None:
        """The package that takes this step, if one does: a decode step of one request, or of
        up to the batch package's requests; one request's drafts up to its package's tokens."""
        if decode:
            if fb.batch_size == 1:
                return self._single
            batch = self._batch
            return batch if batch is not None and fb.batch_size <= batch.max_tokens else None
        drafts = self._drafts
        if drafts is not None and fb.batch_size == 1 and fb.num_tokens <= drafts.max_tokens:
            return drafts
        return None

    @classmethod
    def build(
        cls,
        model: DecoderForCausalLM,
        pool: KVPool,
        max_rows: int,
        cache_dir: Path,
        aot: bool = True,
        drafts: bool = False,
    ) -> CompiledDecode:
        """The compiled step for `model` over `pool`, warmed up: its shapes compiled (or
        loaded) now; `aot`: one row through a package (compiled_aot.py), kept beside
        `cache_dir` in `aot/`; `drafts`: one request's drafts verified by the graph too."""
        cache_dir.mkdir(parents=True, exist_ok=True)
        # Round where eager rounds (a float32 norm inside a float64 or bfloat16 model), so the
        # compiled step gives eager's values rather than more precise ones.
        torch._inductor.config.emulate_precision_casts = True
        dynamo = torch._dynamo.config
        dynamo.cache_size_limit = max(dynamo.cache_size_limit, RECOMPILE_LIMIT)
        compiled = cls(model, max_rows, drafts)
        compiled.aot_dir = cache_dir.parent / "aot" if aot else None
        start, depth = time.perf_counter(), sys.getrecursionlimit()
        try:
            with temporary_cache_dir(str(cache_dir)):  # not TORCHINDUCTOR_CACHE_DIR: torch
                compiled.warm_up(pool)  # sets it to its default as its config is imported
        finally:  # Inductor lifts the interpreter's recursion limit for good; the server's
            sys.setrecursionlimit(depth)  # bounds on nested request bodies rely on it
        compiled.compile_s = time.perf_counter() - start
        if compiled.aot_dir is not None and compiled.aot_dir.is_dir():
            used = {p.path for p in (compiled._single, compiled._batch, compiled._drafts) if p}
            if removed := prune_packages(compiled.aot_dir, used):
                log.info("removed %d least recently used packages: %s", len(removed), removed)
        log.info(
            "compiled the decode step in %.1f s (Inductor cache: %s, %.1f MB; one-row package: %s)",
            compiled.compile_s,
            cache_dir,
            directory_mb(cache_dir),
            "none" if compiled._single is None else compiled._single.path,
        )
        return compiled

    def row_spans(self) -> list[tuple[int, int]]:
        """The row counts from two to max_rows that one graph takes, (first, last) each: a
        span ends at each row limit of a form (where a linear changes kernel)."""
        firsts = [2, *(n + 1 for n in form_row_limits(self.model.layers))]
        firsts = [n for n in firsts if n <= self.max_rows]
        lasts = [n - 1 for n in firsts[1:]] + [self.max_rows]
        return list(zip(firsts, lasts))

    def warm_up_rows(self) -> list[int]:
        """One row, then each span's last row count where a form's limit ends it, then its
        first: a graph traced at the last count is guarded for the whole span, so a cached
        graph of a narrower span (Inductor's cache from a start whose limits differed) is not
        taken for it, to leave its other counts to a compile inside a step."""
        rows = [1] if self.max_rows >= 1 else []
        limits = set(form_row_limits(self.model.layers))
        for first, last in self.row_spans():
            rows += [last, first] if last > first and last in limits else [first]
        return rows

    def warm_up(self, pool: KVPool) -> None:
        """Run the graph at each of warm_up_rows, so every compile happens now and none
        inside a step; at one row, build the package instead where `aot_dir` is set (Dynamo's
        graph then starts at two rows, symbolic, for any number of requests from two). Where
        `aot_dir` is set, the package of decode steps of 2 to package_span requests, at most
        BATCH_PACKAGE_ROWS (Dynamo's graph keeps those rows for steps verifying several
        requests' drafts). With `verifies_one_request`, one request's drafts' package where
        `aot_dir` is set (up to package_span tokens), and the row counts past it again over
        one request's copy (its longer drafts' steps: Dynamo specializes a size of one). It
        writes K/V into the pool's first slots after the padding slot, which no request holds
        yet. A row count that fails to compile (a form Inductor cannot lower) caps max_rows
        below its span; at one row it raises (the engine then runs eager and says why); over
        one request, it leaves one request's longer drafts to eager steps."""
        for rows in self.warm_up_rows():
            example = self._example(pool, rows, rows)
            if rows == 1 and self.aot_dir is not None:
                self._single = self._build_package(pool, example, 1)
                if self._single is not None:
                    continue
            try:
                self._compile(example, rows, rows)
            except Exception as e:  # noqa: BLE001 - the spans before it stay compiled
                if rows == 1:
                    raise
                self.max_rows = self._first_of_span(rows) - 1
                self.note = (
                    f"decode steps of <= {self.max_rows} rows compiled; larger ones run "
                    f"eager ({type(e).__name__} at {rows} rows: {first_line(e)})"
                )
                log.warning("enable_torch_compile: %s", self.note)
                break
        span = self.package_span()
        if self.aot_dir is not None and (requests := min(span, BATCH_PACKAGE_ROWS)) > 1:
            example = self._example(pool, requests, requests)
            self._batch = self._build_package(pool, example, requests, batch=True)
        packaged = 1  # one request's steps of at most this many tokens run a package
        if self.verifies_one_request and self.aot_dir is not None and span > 1:
            self._drafts = self._build_package(pool, self._example(pool, span, 1), span)
            packaged = span if self._drafts is not None else 1
        for rows in self.warm_up_rows() if self.verifies_one_request else []:
            if rows <= packaged:
                continue
            try:
                self._compile(self._example(pool, rows, 1), rows, 1)
            except Exception as e:  # noqa: BLE001 - such steps run eager
                self.verifies_one_request = False
                self.note = (
                    f"one request's drafts are verified eager ({type(e).__name__} at {rows} "
                    f"rows: {first_line(e)})"
                )
                log.warning("enable_torch_compile: %s", self.note)
                break

    def _example(self, pool: KVPool, tokens: int, requests: int) -> tuple:
        """A step's arguments after the model: `tokens` new tokens over `requests` requests'
        dense copies. Dynamo guards on whether a tensor was made under inference mode, so
        each is made as a step makes it: the batch's ids and positions outside it
        (ForwardBatch), the rest inside (the model's forward)."""
        model, cfg, lay = self.model, self.model.cfg, self.model.layout
        device = next(model.parameters()).device
        ids = torch.zeros(tokens, dtype=torch.long, device=device)
        positions = torch.arange(tokens, device=device) // requests
        capacity = max(WARM_UP_CAPACITY, int(positions[-1]) + 1)
        with torch.inference_mode():
            shape = (requests, capacity, lay.num_kv_heads, cfg.head_dim)
            dense_k = [torch.zeros(shape, dtype=model.dtype, device=device) for _ in pool.k]
            dense_v = [torch.zeros_like(t) for t in dense_k]
            rows = torch.arange(tokens, device=device) % requests
            loc = torch.arange(1, tokens + 1, device=device)
            flat = rows * capacity + positions
        return (ids, positions, rows, loc, flat, pool.k, pool.v, dense_k, dense_v)

    def _compile(self, example: tuple, tokens: int, requests: int) -> None:
        """Run Dynamo's graph once over `example`: the capacity symbolic, and from two on,
        the tokens and the requests, except in a span of one row count (from 2 to a limit of
        2: a linear's kernel choice fixes it, and Dynamo refuses a size marked symbolic that a
        guard fixes)."""
        ids, positions, rows, loc, flat, _, _, dense_k, dense_v = example
        for t in (*dense_k, *dense_v):
            torch._dynamo.mark_dynamic(t, 1)
        if tokens in form_row_limits(self.model.layers) and self._first_of_span(tokens) == tokens:
            tokens = requests = 1  # a span of one count: nothing symbolic but the capacity
        if tokens > 1:  # symbolic from the first size Dynamo compiles past one
            for t in (ids, positions, rows, loc, flat):
                torch._dynamo.mark_dynamic(t, 0)
        if requests > 1:
            for t in (*dense_k, *dense_v):
                torch._dynamo.mark_dynamic(t, 0)
        with torch.inference_mode():
            self._step(self.model, *example)

    def _first_of_span(self, rows: int) -> int:
        """The first row count of the span that holds `rows` (1 for one row)."""
        return max([1, *(first for first, _ in self.row_spans() if first <= rows)])

    def package_span(self) -> int:
        """The most rows the packages of several rows take (a few requests' decode steps, one
        request's drafts): up to the first row limit past one where a linear changes kernel
        (a package holds one kernel per linear)."""
        past_one = [n for n in form_row_limits(self.model.layers) if n > 1]
        return min([self.max_rows, *past_one])

    def _build_package(self, pool: KVPool, example: tuple, max_tokens: int, batch: bool = False):
        """Build (or load) a package (compiled_aot.py) of one request's steps of up to
        `max_tokens` tokens, or with `batch` decode steps of up to as many requests; None,
        with a note, where that fails (Dynamo's graph takes them)."""
        assert self.aot_dir is not None
        self.aot_dir.mkdir(parents=True, exist_ok=True)
        try:
            return build_package(
                self.model, decode_graph, pool, example, self.aot_dir, max_tokens, batch
            )
        except Exception as e:  # noqa: BLE001 - Dynamo's graph takes the steps instead
            steps = "one-row steps" if max_tokens == 1 else "one request's drafts"
            if batch:
                steps = "decode steps of a few requests"
            self.note = (
                f"{steps} run through Dynamo's graph ({type(e).__name__} building their "
                f"AOTInductor package: {first_line(e)})"
            )
            log.warning("enable_torch_compile: %s", self.note)
            return None


def first_line(e: Exception) -> str:
    """An error's first line, at most 200 characters (Inductor's run to pages)."""
    return (str(e).strip().splitlines() or [""])[0][:200]


def directory_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20
