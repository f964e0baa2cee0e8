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

The library holds no copy of the weights: Inductor writes it without them, each constant
pickled beside it in the package; the constants the model holds (its parameters and
buffers, and the tensors its weight forms keep, which export lifts and Inductor numbers in
the order export found them) are then dropped from the package, and a load lends the
library the model's own tensors (AOTInductor's user-managed constants), checked at the
build to be the ones it was compiled with. Only the constants Inductor made itself (the int4
kernel's group size) stay pickled in it. oneDNN-packed weights are not constants at all: the
graph names them by number (weights/dense.py), so the library calls the live model's, and
the numbers, part of the exported code, are part of the package's name. The package is kept
unpacked, a folder the loader reads in place (from a zip it would unpack a copy into the
temp dir, left there by a process that ends without freeing it), under the cache dir, named
by a hash of torch's version, Inductor's settings and vector ISA, the exported graph, its
inputs' and constants' shapes and dtypes, and the constants' bytes, so a later start with
the same model and weight plan on the same kind of CPU loads it instead of compiling (the
export, a few seconds, runs at every start to compute that name, and gives the tensors to
lend), and the example's sizes, by which Inductor plans its loops. The least recently used
packages go once the folder holds more than KEPT_BYTES (prune_packages).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch._inductor.config
from torch._inductor.cpu_vec_isa import pick_vec_isa
from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir
from torch.export.graph_signature import InputKind

if TYPE_CHECKING:
    from ..models.decoder import DecoderForCausalLM
    from .memory import KVPool

MIN_CAPACITY = 2  # export's smallest symbolic size: a dense copy this wide or wider
# Inductor's settings for a library without weights, every constant pickled in the package
WEIGHTLESS = {
    "aot_inductor.package_constants_in_so": False,
    "aot_inductor.package_constants_on_disk_format": "pickle_weights",
}
_MODEL_DIR = "data/aotinductor/model"  # the package's one model, in its top folder
_LENT = "data/stemma/lent.json"  # which of the model's tensors each lent constant is
_NUMBERED = "_tensor_constant"  # Inductor's name for the Nth tensor export lifted
KEPT_BYTES = 1 << 30  # aot/ keeps at most this much: the least recently used packages go
_SCRATCH = "tmp-"  # aot/'s names that are no package: a build's work, a removal under way
_WORK_TTL_S = 3600  # a build's work folder this old was left by a process that died


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
    max_tokens: the most new tokens it takes (one request's, or as many requests' one each).
    live: the model's tensors by export's names ({**ep.state_dict, **ep.constants}), lent
    to the library, which reads them in place (kept here, so they outlive it)."""

    def __init__(
        self, path: Path, built: bool, live: dict[str, torch.Tensor], max_tokens: int = 1
    ) -> None:
        self.path, self.built = path, built  # built: compiled now, not loaded from the cache
        self.max_tokens = max_tokens
        # a folder, read in place: from a zip the loader unpacks a copy into the temp dir,
        # which stays there when the process is killed
        loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
        self.constants, self.lent = package_constants(path, live)
        with contextlib.suppress(OSError):  # a read-only cache still loads
            os.utime(path)  # recency, for prune_packages
        # (use_inactive, check_full_update, user_managed): every constant, none copied
        loader.load_constants(self.constants, False, True, True)
        self._run = loader.boxed_run

    def __call__(self, flat: list[torch.Tensor]) -> torch.Tensor:
        return self._run(flat)[0]


def package_constants(
    path: Path, live: dict[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], frozenset[str]]:
    """(every constant the package's library reads, by its name there; the names lent from
    `live`): the model's tensors where the package lends them, the rest unpickled from it.
    path: the package's folder."""
    config = _weights_config(path)
    lent = json.loads((path / _LENT).read_text())
    constants = {
        name: live[lent[name]] if name in lent else _unpickled(path, *config[name])
        for name in config
    }
    return constants, frozenset(lent)


def _weights_config(path: Path) -> dict[str, list]:
    """The package's constants: name -> [file, shape, stride, offset]."""
    return json.loads((path / _MODEL_DIR / "weights_config.json").read_text())


def _unpickled(path: Path, file: str, shape, stride, offset) -> torch.Tensor:
    whole = torch.load(path / "data" / "weights" / file, weights_only=True)
    return torch.as_strided(whole, shape, stride, offset)


def lend_weights(path: Path, live: dict[str, torch.Tensor], lifted: list[str]) -> None:
    """Drop from the package unpacked in `path` (built with WEIGHTLESS) the constants `live`
    holds, noting which of them each is: a name export kept (a parameter or buffer), or
    Inductor's number for the Nth tensor export lifted (`lifted`, in export's order). Each is
    checked against the pickled copy, so a name read otherwise fails the build."""
    config = _weights_config(path)
    numbered = [fqn for fqn in lifted if fqn not in config]
    lent = {}
    for name, (file, shape, stride, offset) in config.items():
        n = int(name[len(_NUMBERED) :]) if name.startswith(_NUMBERED) else None
        if name in live:
            fqn = name
        elif n is not None and n < len(numbered):
            fqn = numbered[n]
        else:
            continue  # Inductor's own constant: it stays pickled
        if not _same(_unpickled(path, file, shape, stride, offset), live[fqn]):
            raise RuntimeError(f"the package's constant {name} is not the model's {fqn}")
        lent[name] = fqn
    kept = {config[name][0] for name in config if name not in lent}
    for file in {config[name][0] for name in lent} - kept:
        (path / "data" / "weights" / file).unlink()
    (path / _LENT).parent.mkdir(parents=True, exist_ok=True)
    (path / _LENT).write_text(json.dumps(lent))


def _unpack(z: zipfile.ZipFile, out: Path) -> None:
    """The zip's files under its top folder, written under `out`, each name checked to stay
    inside it."""
    root = out.resolve()
    for info in z.infolist():
        inner = info.filename.split("/", 1)[1] if "/" in info.filename else ""
        if not inner or info.is_dir():
            continue
        dest = (out / inner).resolve()
        if not dest.is_relative_to(root):
            raise RuntimeError(f"a package's file {info.filename!r} lies outside it")
        dest.parent.mkdir(parents=True, exist_ok=True)
        with z.open(info) as src, open(dest, "wb") as dst:
            shutil.copyfileobj(src, dst)


def prune_packages(aot_dir: Path, keep: set[Path], max_bytes: int = KEPT_BYTES) -> list[str]:
    """Remove the least recently used packages in `aot_dir` (each load marks its folder
    used) until the rest take at most `max_bytes`, never one in `keep`, and the work
    folders of builds that died (older than an hour); the names removed. A package goes by
    a rename first, so a start never finds half of one; errors cost only the pruning."""
    entries, now = [], time.time()
    try:
        for p in aot_dir.iterdir():
            st = p.stat()
            if p.name.startswith(_SCRATCH):
                if now - st.st_mtime > _WORK_TTL_S:
                    shutil.rmtree(p, ignore_errors=True)
                continue
            files = [f for f in p.rglob("*") if f.is_file()] if p.is_dir() else [p]
            entries.append((st.st_mtime, p, sum(f.stat().st_size for f in files)))
    except OSError:
        return []
    total, removed = sum(size for _, _, size in entries), []
    for _, p, size in sorted(entries, key=lambda e: e[0]):
        if total <= max_bytes:
            break
        if p in keep:
            continue
        try:
            gone = aot_dir / f"{_SCRATCH}removed-{p.name}"
            os.replace(p, gone)
            if gone.is_dir():
                shutil.rmtree(gone, ignore_errors=True)
            else:
                gone.unlink()
        except OSError:
            continue
        total -= size
        removed.append(p.name)
    return removed


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same shape, strides, dtype and bytes."""
    if (a.shape, a.stride(), a.dtype) != (b.shape, b.stride(), b.dtype):
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


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
    live = {
        name: t
        for name, t in {**ep.state_dict, **ep.constants}.items()
        if isinstance(t, torch.Tensor)
    }
    lifted = [
        spec.target
        for spec in ep.graph_signature.input_specs
        if spec.kind == InputKind.CONSTANT_TENSOR and spec.target is not None
    ]
    with torch._inductor.config.patch(WEIGHTLESS):  # in the name too, through the settings
        path = cache_dir / f"{kind}-{_digest(ep, sizes)}"  # a folder: the package unpacked
        if path.is_dir():
            return PackagedStep(path, built=False, live=live, max_tokens=max_tokens)
        zipped = path.with_name(path.name + ".pt2")  # as earlier versions kept it
        if zipped.is_file():
            with tempfile.TemporaryDirectory(prefix=f"{_SCRATCH}build-", dir=cache_dir) as work:
                with zipfile.ZipFile(zipped) as z:
                    _unpack(z, Path(work) / "package")
                _place(Path(work) / "package", path)
            zipped.unlink(missing_ok=True)
            return PackagedStep(path, built=False, live=live, max_tokens=max_tokens)
        # Inductor's files for it (a copy of the weights) go once it is packaged; the
        # package is moved into place whole, so a reader sees all of it or none
        with (
            tempfile.TemporaryDirectory(prefix=f"{_SCRATCH}build-", dir=cache_dir) as work,
            temporary_cache_dir(work),
            # the compile writes this CPU's facts into Inductor's settings in place; a dict
            # of its own keeps them out of the process's, which Dynamo's graphs compiled
            # after it hash into their cache keys (else a start that loads the package,
            # compiling nothing here, finds none of the graphs a cold start cached)
            torch._inductor.config.patch({"aot_inductor.metadata": {}}),
        ):
            built, folder = Path(work) / "built.pt2", Path(work) / "package"
            torch._inductor.aoti_compile_and_package(ep, package_path=str(built))
            with zipfile.ZipFile(built) as z:
                _unpack(z, folder)
            lend_weights(folder, live, lifted)
            _place(folder, path)
    return PackagedStep(path, built=True, live=live, max_tokens=max_tokens)


def _place(folder: Path, path: Path) -> None:
    """Move `folder` to `path` whole; where another start put one there first, keep that."""
    try:
        os.replace(folder, path)
    except OSError:
        if not path.is_dir():
            raise


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
