"""Decode-attention benchmark on one CUDA GPU: latency and achieved memory bandwidth of the
Triton kernel and of the torch backend, against the card's measured copy bandwidth.

Bandwidth counts the bytes a decode step must move (every K/V row of every context once, plus
q, out and kv_indices); outputs are checked against the torch backend before anything is timed.
Run: python -m stemma.bench.kernels_bench   (appends JSON lines to bench/results/kernels.jsonl)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .common import RESULTS_DIR, append_results

if TYPE_CHECKING:
    from stemma.runtime.executor.forward_batch import ForwardBatch
    from stemma.runtime.executor.memory import KVPool

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
RESULTS = RESULTS_DIR / "kernels.jsonl"
TARGET_FRACTION = 0.6  # of copy bandwidth, for batch 32 x context 4096


@dataclass(slots=True, frozen=True)
class DecodeWorkload:
    batch_size: int
    context_len: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: str

    def bytes_moved(self) -> int:
        elem = DTYPES[self.dtype].itemsize
        kv = 2 * self.batch_size * self.context_len * self.num_kv_heads * self.head_dim * elem
        q_and_out = 2 * self.batch_size * self.num_heads * self.head_dim * elem
        return kv + q_and_out + 4 * self.batch_size * self.context_len


def bench_ms(fn: Callable[[], object]) -> float:
    from triton.testing import do_bench

    # do_bench clears the L2 cache before each run, so small contexts are not served from it.
    return float(do_bench(fn, warmup=25, rep=200, return_mode="median"))


def copy_bandwidth_gbps(num_bytes: int, device: torch.device) -> float:
    """Device-to-device copy of a large buffer: bytes read + bytes written per second."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    return 2 * num_bytes / (ms * 1e-3) / 1e9


def build_decode_step(
    w: DecodeWorkload, device: torch.device
) -> tuple[ForwardBatch, KVPool, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A pool holding every request's context in shuffled pages, and its decode ForwardBatch."""
    from stemma.runtime.executor.forward_batch import ForwardBatch
    from stemma.runtime.executor.memory import KVPool

    gen = torch.Generator().manual_seed(0)
    pages_per_req = -(-w.context_len // w.page_size)
    num_pages = w.batch_size * pages_per_req
    pages = torch.randperm(num_pages, generator=gen) + 1  # page 0 holds the padding slot
    offsets = torch.arange(w.page_size)
    slots = (pages[:, None] * w.page_size + offsets).reshape(w.batch_size, -1)
    req_to_token = slots[:, : w.context_len].to(torch.int32).contiguous()  # [B, context_len]
    dtype = DTYPES[w.dtype]
    pool = KVPool((num_pages + 1) * w.page_size, 1, w.num_kv_heads, w.head_dim, dtype, device)
    pool.k[0].normal_()
    pool.v[0].normal_()
    fb = ForwardBatch.build(
        req_to_token,
        list(range(w.batch_size)),
        [w.context_len - 1] * w.batch_size,
        [[1]] * w.batch_size,
        req_to_token[:, -1],
        device=device,
    )
    q = torch.randn(w.batch_size, w.num_heads, w.head_dim, device=device, dtype=dtype)
    k = torch.randn(w.batch_size, w.num_kv_heads, w.head_dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    return fb, pool, q, k, v


def bench_decode(w: DecodeWorkload, device: torch.device, with_torch: bool) -> dict[str, float]:
    from stemma.kernels.decode_attn import decode_attention
    from stemma.runtime.executor.attention import TorchAttnBackend

    fb, pool, q, k, v = build_decode_step(w, device)
    sm_scale = w.head_dim**-0.5
    torch_backend = TorchAttnBackend()
    torch_backend.init_forward_metadata(fb)
    want = torch_backend.forward(q, k, v, 0, fb, pool, sm_scale)  # also writes the new K/V

    def run_triton() -> torch.Tensor:
        return decode_attention(
            q, pool.k[0], pool.v[0], fb.kv_indptr, fb.kv_indices, sm_scale,
            max_seq_len=w.context_len,
        )  # fmt: skip

    torch.testing.assert_close(run_triton().float(), want.float(), atol=3e-2, rtol=3e-2)
    gbytes = w.bytes_moved() / 1e9
    result = {"triton_latency_us": bench_ms(run_triton) * 1e3}
    result["triton_bandwidth_gbps"] = gbytes / (result["triton_latency_us"] * 1e-6)
    if with_torch:
        # The backend's whole forward: K/V write (batch_size rows), padded gather, SDPA.
        ms = bench_ms(lambda: torch_backend.forward(q, k, v, 0, fb, pool, sm_scale))
        result["torch_latency_us"] = ms * 1e3
        result["torch_bandwidth_gbps"] = gbytes / (ms * 1e-3)
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32, 128])
    p.add_argument("--context-lens", type=int, nargs="+", default=[512, 4096])
    p.add_argument("--num-heads", type=int, default=32)
    p.add_argument("--num-kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--copy-gib", type=float, default=1.0, help="buffer size for copy bandwidth")
    p.add_argument("--no-torch", action="store_true", help="skip the torch backend baseline")
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("kernels_bench needs a CUDA GPU: torch.cuda.is_available() is False here")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("kernels_bench times compiled kernels: unset TRITON_INTERPRET")
    import triton

    device = torch.device("cuda")
    given = sys.argv[1:] if argv is None else argv
    command = " ".join(["python -m stemma.bench.kernels_bench", *given])
    meta = {"device": torch.cuda.get_device_name(device), "triton": triton.__version__}
    records = []
    copy_bytes = int(args.copy_gib * 2**30)
    copy_gbps = copy_bandwidth_gbps(copy_bytes, device)
    records.append(({"op": "copy", "bytes": copy_bytes}, "copy_bandwidth_gbps", copy_gbps))
    print(f"{meta['device']}: device-to-device copy {copy_gbps:.0f} GB/s")
    print(f"{'batch':>5} {'ctx':>5} | {'triton us':>9} {'GB/s':>6} {'of copy':>7} | "
          f"{'torch us':>9} {'GB/s':>6} {'speedup':>7}")  # fmt: skip
    for batch_size in args.batch_sizes:
        for context_len in args.context_lens:
            w = DecodeWorkload(
                batch_size, context_len, args.num_heads, args.num_kv_heads, args.head_dim,
                args.page_size, args.dtype,
            )  # fmt: skip
            r = bench_decode(w, device, with_torch=not args.no_torch)
            torch.cuda.empty_cache()  # the next workload's pool may need the memory
            workload = {"op": "decode_attention", **asdict(w)}
            fraction = r["triton_bandwidth_gbps"] / copy_gbps
            records += [(workload, name, value) for name, value in r.items()]
            records.append((workload, "triton_fraction_of_copy_bw", fraction))
            line = f"{batch_size:>5} {context_len:>5} | {r['triton_latency_us']:>9.1f} "
            line += f"{r['triton_bandwidth_gbps']:>6.0f} {fraction:>7.0%} |"
            if "torch_latency_us" in r:
                line += f" {r['torch_latency_us']:>9.1f} {r['torch_bandwidth_gbps']:>6.0f}"
                line += f" {r['torch_latency_us'] / r['triton_latency_us']:>6.1f}x"
            print(line)
            if (batch_size, context_len) == (32, 4096):
                verdict = "meets" if fraction >= TARGET_FRACTION else "MISSES"
                print(f"      {verdict} the {TARGET_FRACTION:.0%} copy-bandwidth target")
    rows = [{"workload": w, "metric": metric, "value": value} for w, metric, value in records]
    append_results("kernels", rows, path=args.out, command=command, **meta)
    print(f"appended {len(records)} records to {args.out}")


if __name__ == "__main__":
    main()
