"""Single-stream steps compiled ahead of time (AOTInductor): the graph compiled.py traces,
exported with torch.export and built by Inductor into a shared library whose C++ wrapper calls
its kernels. A step then runs without Dynamo's guard checks and without the Python function
that calls Inductor's kernels one by one, about 1.5 ms of a 9 ms SmolLM2 step on a 2-core CPU
(bench/results/compiled_aot.jsonl), and about 3 ms of a step verifying one request's drafts.
Single-stream and small-batch decode are where that overhead counts, so three packages: the
one-row decode step; decode steps of 2 to `max_tokens` requests, a token each (the count
symbolic); and one request's drafts (2 to `max_tokens` tokens, the count symbolic). Both
spans end at the first row limit where a linear changes kernel, as the kernel is part of the
code. Batches past it, and steps verifying several requests' drafts, keep the Dynamo graph
(compiled.py).

The library holds its own copy of the weights (Inductor folds some of them into the forms
its kernels read, under names of its own, so they cannot be lent from the live model): one
more copy of the decoder's weights in memory. oneDNN-packed weights are the exception: the
graph names them by number (weights/dense.py), so the library calls the live model's, and
the numbers, part of the exported code, are part of the package's name. The package is kept
under the cache dir, named by a hash of torch's version, Inductor's settings and vector ISA,
the exported graph, its inputs' and constants' shapes and dtypes, and the constants' bytes,
so a later start with the same model and weight plan on the same kind of CPU loads it
instead of compiling (the export, a few seconds, runs at every start to compute that name),
and the example's sizes, by which Inductor plans its loops.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch._inductor.config
from torch._inductor.cpu_vec_isa import pick_vec_isa
from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

if TYPE_CHECKING:
    from ..models.decoder import DecoderForCausalLM
    from .memory import KVPool

MIN_CAPACITY = 2  # export's smallest symbolic size: a dense copy this wide or wider


class _Step(torch.nn.Module):
    """The graph's function as a module, for torch.export (the model's weights its own)."""

    def __init__(self, model: DecoderForCausalLM, graph: Any) -> None:
        super().__init__()
        self.model, self.graph = model, graph

    def forward(self, ids, positions, rows, out_loc, flat_pos, pool_k, pool_v, dense_k, dense_v):
        return self.graph(
            self.model,
            ids,
            positions,
            rows,
            out_loc,
            flat_pos,
            pool_k,
            pool_v,
            dense_k,
            dense_v,
        )


class PackagedStep:
    """A loaded package: call it with the step's inputs flattened, as `inputs` lists them.
    max_tokens: the most new tokens it takes (one request's, or as many requests' one each)."""

    def __init__(self, path: Path, built: bool, max_tokens: int = 1) -> None:
        self.path, self.built = path, built  # built: compiled now, not loaded from the cache
        self.max_tokens = max_tokens
        self._run = torch._inductor.aoti_load_package(str(path)).loader.boxed_run

    def __call__(self, flat: list[torch.Tensor]) -> torch.Tensor:
        return self._run(flat)[0]


def inputs(
    ids, positions, rows, out_loc, flat_pos, pool_k, pool_v, dense_k, dense_v
) -> list[torch.Tensor]:
    """The step's inputs in the package's order (its inputs as one flat list)."""
    return [ids, positions, rows, out_loc, flat_pos, *pool_k, *pool_v, *dense_k, *dense_v]


def build_package(
    model: DecoderForCausalLM,
    graph: Any,
    pool: KVPool,
    example: tuple,
    cache_dir: Path,
    max_tokens: int = 1,
    batch: bool = False,
) -> PackagedStep:
    """Export `graph` (decode_graph.decode_graph) over `example` (its arguments after the model;
    the dense copy's capacity symbolic) and load its package from `cache_dir`, or compile it
    there first. max_tokens 1: the one-row decode step; more: steps of 2 to max_tokens tokens
    (the count symbolic; the example's sets the loops), one request's drafts, or with `batch`
    a decode step of as many requests, a token each (the copy's requests the same count)."""
    layers = len(pool.k)
    capacity = torch.export.Dim("capacity", min=MIN_CAPACITY, max=1 << 24)
    # (a span of one count, 2 to 2, stays static: export refuses a Dim whose range is one)
    tokens = torch.export.Dim("tokens", min=2, max=max_tokens) if max_tokens > 2 else None
    per_token = {0: tokens} if tokens is not None else None  # ids, positions, rows, slots
    dense = [{0: tokens, 1: capacity} if batch and tokens is not None else {1: capacity}]
    shapes = (*[per_token] * 5, [None] * layers, [None] * layers, dense * layers, dense * layers)
    with torch.no_grad():
        ep = torch.export.export(_Step(model, graph), example, dynamic_shapes=shapes, strict=False)
    # the example's sizes too: Inductor plans its loops by them, symbolic or not
    sizes = [tuple(t.shape) for t in inputs(*example)]
    kind = "batch" if batch else "drafts"
    kind = "decode-1row" if max_tokens == 1 else f"{kind}-2to{max_tokens}"
    path = cache_dir / f"{kind}-{_digest(ep, sizes)}.pt2"
    if path.exists():
        return PackagedStep(path, built=False, max_tokens=max_tokens)
    # Inductor's files for it (a second copy of the weights) go once it is packaged; the
    # package is moved into place whole, so a reader sees all of it or none
    with tempfile.TemporaryDirectory(dir=cache_dir) as work, temporary_cache_dir(work):
        partial = Path(work) / "package.pt2"
        torch._inductor.aoti_compile_and_package(ep, package_path=str(partial))
        os.replace(partial, path)
    return PackagedStep(path, built=True, max_tokens=max_tokens)


def _digest(ep: torch.export.ExportedProgram, sizes: list) -> str:
    """What the package's code and weights depend on, hashed (sha256, 24 hex digits); sizes:
    the example's."""
    h = hashlib.sha256()
    h.update(torch.__version__.encode())
    h.update(repr(sizes).encode())
    config = torch._inductor.config.save_config_portable()  # what Inductor's code follows
    config.pop("aot_inductor.metadata", None)  # what a compile notes down, not follows
    h.update(repr(sorted(config.items(), key=lambda kv: kv[0])).encode())
    h.update(str(pick_vec_isa()).encode())  # the vector ISA its kernels are built for
    h.update(ep.graph_module.code.encode())
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            h.update(
                f"{node.name}:{getattr(val, 'shape', val)}:{getattr(val, 'dtype', '')}".encode()
            )
    for name, t in sorted({**ep.state_dict, **ep.constants}.items()):
        if not isinstance(t, torch.Tensor):
            h.update(f"{name}:{t!r}".encode())
            continue
        h.update(f"{name}:{tuple(t.shape)}:{t.stride()}:{t.dtype}".encode())
        data = t.detach().contiguous().view(-1)
        if data.numel():
            h.update(data.view(torch.uint8).numpy().data)
    return h.hexdigest()[:24]
