"""dtype "auto": the fastest exact-enough compute dtype the device runs natively, and a warning
with a measured slowdown when an explicit dtype falls to the hardware's slow path; and the
measurements of this machine that the weight plan decides from (MachineMeasurements).

On CPUs without native bfloat16 (AVX2-only x86, e.g. AMD EPYC before Zen 4) torch's bfloat16
and float16 matmuls run a reference loop: on a 2-core AVX2 EPYC an 8-request decode of
SmolLM2-135M took 9.5x float32's time (bench/dtype_bench.py). There "auto" is float32; where
oneDNN runs bfloat16 natively (AVX512-BF16 / AMX) it is bfloat16.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .measured import KeptMeasurements

log = logging.getLogger("stemma.dtype")

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    name: str  # a key of DTYPES
    reason: str  # one line: why this dtype, for the start-up log and /get_server_info

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.name]

    def noting(self, note: str) -> DtypeChoice:
        """This choice with `note` (the weight plan's reason, if any) after its reason."""
        return dataclasses.replace(self, reason=f"{self.reason}; {note}") if note else self


def _onednn_bf16() -> bool:
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN runs bfloat16 matmuls natively on this CPU (AVX512-BF16 / AMX)."""
    return _onednn_bf16()


def can_pack_bf16_weights() -> bool:
    """Whether oneDNN has the bfloat16 kernels that multiply packed weights: the same probe,
    kept apart because tests fake cpu_has_native_bf16 to take the other dtype branch, while
    packing needs the kernels themselves."""
    return _onednn_bf16()


def fp16_weights_available() -> bool:
    """Whether torch has fbgemm's float16-weight matmul here (x86 builds)."""
    return "fbgemm" in torch.backends.quantized.supported_engines


def cpu_isa() -> str:
    """torch's CPU kernel level, e.g. "AVX2", "AVX512" (what its vectorized ops use)."""
    return torch.backends.cpu.get_cpu_capability()


def auto_dtype(device: str) -> DtypeChoice:
    """The dtype "auto" resolves to on `device`."""
    if device.startswith("cuda"):
        if torch.cuda.is_bf16_supported():
            return DtypeChoice("bfloat16", "auto: this GPU computes bfloat16 natively")
        return DtypeChoice("float16", "auto: this GPU has no bfloat16; float16 is native")
    if cpu_has_native_bf16():
        return DtypeChoice("bfloat16", f"auto: oneDNN runs bfloat16 natively ({cpu_isa()})")
    return DtypeChoice(
        "float32",
        f"auto: no native bfloat16 on this CPU ({cpu_isa()}); reduced-precision matmuls "
        "would take torch's reference path",
    )


def resolve_dtype(name: str, device: str, hidden: int = 1024, inter: int = 4096) -> DtypeChoice:
    """ "auto" or an explicit dtype name -> the choice, logged. An explicit dtype that this CPU
    runs on its slow path is kept, with a warning that gives the measured slowdown of one
    [32, hidden] x [hidden, inter] matmul against the auto choice."""
    best = auto_dtype(device)
    if name == "auto":
        log.info("dtype %s (%s)", best.name, best.reason)
        return best
    if name not in DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {tuple(DTYPES)}, got {name!r}")
    choice = DtypeChoice(name, "explicit")
    is_slow_path = device == "cpu" and name in ("bfloat16", "float16") and best.name != name
    if is_slow_path:
        ratio = measured_slowdown(DTYPES[name], best.torch_dtype, hidden, inter)
        message = (
            f"dtype {name} has no native matmul on this CPU ({cpu_isa()}): a 32-row linear "
            f"{hidden}->{inter} measured {ratio:.1f}x slower than in {best.name}; "
            f"use dtype='auto' ({best.name}) unless you need {name}"
        )
        log.warning(message)
        choice = DtypeChoice(name, "explicit; " + message)
    else:
        log.info("dtype %s (explicit)", name)
    return choice


def measured_slowdown(
    slow: torch.dtype, fast: torch.dtype, hidden: int, inter: int, rows: int = 32
) -> float:
    """time(slow) / time(fast) for one linear of the model's MLP shape, best of 3 each."""

    def linear_time(dtype: torch.dtype) -> float:
        x = torch.randn(rows, hidden, dtype=dtype)
        w = torch.randn(inter, hidden, dtype=dtype)
        return best_time(lambda: F.linear(x, w))

    return linear_time(slow) / linear_time(fast)


class MachineMeasurements:
    """weight_plan.Measurements of this machine for a model's MLP shape, each taken when the
    plan first asks for it: the speed verdicts are asked only for dtype "auto" resolved to
    float32 (they cost about a second, once per process and shape)."""

    def __init__(self, hidden: int, inter: int, kept: KeptMeasurements | None = None):
        """kept: where verdicts are kept across starts (measured.py); None: measure here."""
        self.hidden, self.inter = hidden, inter
        self.kept = kept or KeptMeasurements(None)

    @property
    def can_pack(self) -> bool:
        return can_pack_bf16_weights()

    @property
    def fp16_kernel(self) -> bool:
        return fp16_weights_available()

    @property
    def fp16_weights_win(self) -> bool:
        shape = (self.hidden, self.inter)
        return self.kept.value("fp16_weights_win", shape, lambda: fp16_weights_win(*shape))

    @property
    def small_step_rows(self) -> int:
        shape = (self.hidden, self.inter)
        return self.kept.value(
            "bfloat16_small_step_rows", shape, lambda: bfloat16_small_step_rows(*shape)
        )

    @property
    def available_bytes(self) -> int | None:
        return available_memory_bytes()


@functools.cache  # a property of this machine and shape: measured once per process
def fp16_weights_win(hidden: int, inter: int, weight_bytes: int = 64 << 20) -> bool:
    """Whether fbgemm's matmul on float16 weights (float32 activations, widened in registers)
    beats float32 at 1, 8 and 64 rows here, over 64 MB of float32 weights so that they
    stream from memory as a model's do. On a 2-core AVX2 EPYC, over SmolLM2-135M's 120
    linears: 2.7x float32 at 1 row, 2.6x at 8, 1.5x at 64, 1.2x at 256; it also beats the
    bfloat16 copy at every row count (1.2x at 1 row, 4.5x at 8)."""
    if not fp16_weights_available():
        return False
    torch.backends.quantized.engine = "fbgemm"
    weights = streaming_weights(hidden, inter, weight_bytes)
    packed = [torch.ops.quantized.linear_prepack_fp16(w, None) for w in weights]
    fp16_matmul = torch.ops.quantized.linear_dynamic_fp16
    for rows in (1, 8, 64):
        x = torch.randn(rows, hidden)
        full = best_time(lambda x=x: [F.linear(x, w) for w in weights])
        half = best_time(lambda x=x: [fp16_matmul(x, p) for p in packed])
        if half >= full:
            return False
    return True


def available_memory_bytes() -> int | None:
    """Free physical memory (Linux), else all physical memory (macOS has no free-page count),
    else None."""
    for pages in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
        try:
            return os.sysconf(pages) * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            continue
    return None


@functools.cache  # a property of this machine and shape: measured once per process
def bfloat16_small_step_rows(
    hidden: int, inter: int, max_rows: int = 8, weight_bytes: int = 64 << 20
) -> int:
    """The most rows (1, 2, 4 or 8) at which a bfloat16 linear runs faster than float32 here,
    over 64 MB of float32 weights so that they stream from memory as a model's do (a single
    cache-resident matrix shows no difference); 0 if bfloat16 never wins."""
    weights = streaming_weights(hidden, inter, weight_bytes)
    halves = [w.to(torch.bfloat16) for w in weights]

    def half(rows: int) -> float:
        x = torch.randn(rows, hidden)
        return best_time(lambda: [F.linear(x.to(torch.bfloat16), w) for w in halves])

    def full(rows: int) -> float:
        x = torch.randn(rows, hidden)
        return best_time(lambda: [F.linear(x, w) for w in weights])

    return crossover_rows(half, full, max_rows)


def crossover_rows(
    few_time: Callable[[int], float],
    many_time: Callable[[int], float],
    max_rows: int,
    margin: float = 0.0,
) -> int:
    """The most rows (1, 2, 4, ... up to max_rows, doubling) at which few_time(rows) beats
    many_time(rows) by `margin` (a fraction of it), stopping at the first loss; 0 if the
    few-row kernel loses at one row."""
    best, rows = 0, 1
    while rows <= max_rows and few_time(rows) < (1 - margin) * many_time(rows):
        best, rows = rows, rows * 2
    return best


def streaming_weights(hidden: int, inter: int, weight_bytes: int) -> list[torch.Tensor]:
    """Random [inter, hidden] float32 weights, `weight_bytes` of them, so that a timed pass
    streams them from memory as a model's step does (one cache-resident matrix would not)."""
    count = max(1, weight_bytes // (4 * hidden * inter))
    return [torch.empty(inter, hidden).uniform_(-0.05, 0.05) for _ in range(count)]


def best_time(fn: Callable[[], object], repeats: int = 3) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)
