"""Compile every kernel for a GPU architecture on a machine without a GPU.

The interpreter (TRITON_INTERPRET=1, how the tests run the kernels on CPU) accepts code that
Triton's compiler refuses, a global that is not a constexpr for one. Here each launcher runs
on CPU tensors with its kernel launches captured instead of run, and every captured
specialization (argument types, constexprs, num_warps, num_stages) is compiled ahead of time
to a cubin with the ptxas that ships in Triton's wheel. No driver and no GPU are needed.

    python -m stemma.kernels.aot [--arch 90 80] [--quick]   (exit status 1 if any fails)

Run it without TRITON_INTERPRET: the kernels must be compiled functions, not interpreted ones.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch
import triton

from . import _common

POINTER_TYPES = {
    torch.float32: "*fp32",
    torch.float16: "*fp16",
    torch.bfloat16: "*bf16",
    torch.int32: "*i32",
    torch.int64: "*i64",
}
LAUNCH_OPTIONS = ("num_warps", "num_stages")


@dataclass(slots=True)
class Launch:
    """One captured kernel launch, as triton.compile needs it."""

    kernel: Any  # triton.runtime.JITFunction
    signature: dict[str, str]
    constexprs: dict[str, Any]
    options: dict[str, Any]

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__

    def describe(self) -> str:
        values = ", ".join(f"{k}={v}" for k, v in self.constexprs.items())
        types = sorted({t for t in self.signature.values() if t.startswith("*")})
        return f"{self.name}({values}; {' '.join(types)})"

    def compile(self, arch: int) -> Any:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        src = ASTSource(self.kernel, self.signature, self.constexprs)
        return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=self.options)


def scalar_type(name: str, value: Any) -> str:
    if isinstance(value, torch.Tensor):
        if value.dtype not in POINTER_TYPES:
            raise TypeError(f"{name}: no pointer type for {value.dtype}")
        return POINTER_TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"{name}: cannot type {type(value).__name__} {value!r}")


def to_launch(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Launch:
    params = list(inspect.signature(kernel.fn).parameters)
    values = dict(zip(params, args, strict=False))
    values |= {k: v for k, v in kwargs.items() if k in params}
    missing = [p for p in params if p not in values]
    if missing:
        raise TypeError(f"{kernel.fn.__name__}: launch leaves {missing} unset")
    signature, constexprs = {}, {}
    for param, name in zip(kernel.params, params, strict=True):
        if param.is_constexpr:
            signature[name] = "constexpr"
            constexprs[name] = values[name]
        else:
            signature[name] = scalar_type(name, values[name])
    options = {k: kwargs[k] for k in LAUNCH_OPTIONS if k in kwargs}
    return Launch(kernel, signature, constexprs, options)


@contextlib.contextmanager
def capture_launches() -> Iterator[list[Launch]]:
    """Within the block, launchers accept CPU tensors and their launches are recorded."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("unset TRITON_INTERPRET: interpreted kernels cannot be compiled")
    launches: list[Launch] = []

    def record(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        launches.append(to_launch(self, args, kwargs))

    with (
        mock.patch.object(triton.runtime.JITFunction, "run", record),
        mock.patch.object(_common, "CAPTURING_LAUNCHES", True),
    ):
        yield launches


def paged(seq_lens: list[int], num_kv_heads: int, head_dim: int, dtype: torch.dtype):
    """Buffers of the right types and shapes; the values never matter (nothing runs)."""
    total = sum(seq_lens)
    k = torch.zeros(total + 1, num_kv_heads, head_dim, dtype=dtype)
    indptr = torch.tensor([0, *torch.tensor(seq_lens).cumsum(0).tolist()], dtype=torch.int32)
    indices = torch.arange(1, total + 1, dtype=torch.int32)
    return k, k.clone(), indptr, indices


# (dtype, GQA group, head_dim, logit_cap): the slice of the cross product the interpreter
# tests cover. QUICK reaches every constexpr branch (fp32's exact dots and the 16-bit MMA,
# a head_dim that is not a power of two, the soft cap, both bitmask row modes).
CASES = [
    (dtype, *shape)
    for dtype in (torch.float32, torch.float16, torch.bfloat16)
    for shape in ((1, 64, 0.0), (3, 128, 0.0), (3, 80, 0.0), (4, 64, 30.0))
]
QUICK = [(torch.bfloat16, 3, 80, 0.0), (torch.float32, 1, 64, 30.0)]


def launch_cases(cases: list[tuple[torch.dtype, int, int, float]]) -> None:
    """Every launcher once per case: decode and extend attention, the token bitmask."""
    from .decode_attn import decode_attention
    from .extend_attn import extend_attention
    from .token_bitmask import apply_token_bitmask

    for dtype, group, head_dim, cap in cases:
        k, v, indptr, indices = paged([7, 300], 2, head_dim, dtype)
        q = torch.zeros(2, 2 * group, head_dim, dtype=dtype)
        decode_attention(q, k, v, indptr, indices, head_dim**-0.5, cap, num_kv_splits=8)
        q = torch.zeros(9, 2 * group, head_dim, dtype=dtype)
        qo = torch.tensor([0, 4, 9], dtype=torch.int32)
        extend_attention(q, k, v, qo, indptr, indices, head_dim**-0.5, cap)
        logits = torch.zeros(3, 1000, dtype=dtype)
        bitmask = torch.zeros(3, 32, dtype=torch.int32)
        apply_token_bitmask(logits, bitmask)
        apply_token_bitmask(logits, bitmask, torch.tensor([0, 2], dtype=torch.int32))


def compile_all(
    archs: list[int], launcher: Callable[[], None]
) -> list[tuple[int, str, str | None, float]]:
    """(arch, launch, error or None, seconds) for every distinct captured launch."""
    with capture_launches() as launches:
        launcher()
    distinct = {launch.describe(): launch for launch in launches}
    results = []
    for arch in archs:
        for described, launch in distinct.items():
            start = time.perf_counter()
            try:
                launch.compile(arch)
                error = None
            except Exception as e:  # noqa: BLE001 - every failure is reported, then counted
                error = f"{type(e).__name__}: {e}"
            results.append((arch, described, error, time.perf_counter() - start))
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, nargs="+", default=[90, 80], help="sm_XX, e.g. 90 80")
    p.add_argument("--quick", action="store_true", help="each constexpr branch once (tests)")
    args = p.parse_args(argv)
    cases = QUICK if args.quick else CASES
    results = compile_all(args.arch, lambda: launch_cases(cases))
    for arch, described, error, seconds in results:
        print(f"sm_{arch} {'FAIL' if error else 'ok  '} {seconds:5.2f}s {described}")
        if error:
            print("    " + error.replace("\n", "\n    "))
    failed = sum(error is not None for _, _, error, _ in results)
    print(f"{len(results) - failed} of {len(results)} compiled for sm_{args.arch}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
