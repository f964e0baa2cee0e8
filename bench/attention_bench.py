"""One decode step's attention over a shared prefix, three ways, on this CPU.

  python -m stemma.bench.attention_bench [--repeats 9] [--calls 200] [--dtype float32]

For B requests that share a P-token prefix, then R tokens of their own (SmolLM2's heads: 9
query heads over 3 KV heads of 64), per call, interleaved:
  dense:           decode_sdpa over every request's whole context (the prefix read B times)
  cascade_einsum:  cascade_attention, the prefix read once (einsum; still extend's path)
  cascade_decode:  cascade_decode, the same as batched matrix products (decode's path)
The torch backend uses cascade only where (B - 1) x P >= CASCADE_MIN_SAVED_POSITIONS;
`dense_vs_decode` > 1 means cascade wins there.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from ..runtime.executor.attention import (
    CASCADE_MIN_SAVED_POSITIONS,
    cascade_attention,
    cascade_decode,
    decode_sdpa,
)
from .common import append_results, interleaved_times, print_table

SHAPES = [
    (8, 40, 30),
    (8, 300, 60),
    (16, 200, 60),
    (8, 500, 60),
    (8, 1000, 60),
    (32, 200, 64),
    (32, 1000, 60),
    (2, 64, 8),
]
HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def case(batch: int, prefix: int, rest: int, calls: int, dtype: torch.dtype = torch.float32):
    """The three ways as callables running `calls` attention calls each, over one set of
    inputs; the outputs are checked equal first."""
    torch.manual_seed(0)
    q = torch.randn(batch, 1, HEADS, HEAD_DIM, dtype=dtype)
    ctx = prefix + rest
    k = torch.randn(batch, ctx, KV_HEADS, HEAD_DIM, dtype=dtype)
    v = torch.randn(batch, ctx, KV_HEADS, HEAD_DIM, dtype=dtype)
    k[:, :prefix], v[:, :prefix] = k[:1, :prefix], v[:1, :prefix]  # the shared prefix
    k_shared, v_shared, k_rest, v_rest = k[0, :prefix], v[0, :prefix], k[:, prefix:], v[:, prefix:]
    mask = torch.ones(batch, 1, 1, rest, dtype=torch.bool)
    mask[1:, ..., rest - 1] = False  # contexts of two lengths, so the mask is used
    bias = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, float("-inf"))
    dense_bias = torch.cat([torch.zeros(batch, 1, 1, prefix, dtype=dtype), bias], dim=-1)
    scale = HEAD_DIM**-0.5

    def dense():  # the torch backend's decode attention without cascade
        return decode_sdpa(q[:, 0], k, v, dense_bias, scale)[:, None]

    ways = {
        "dense": dense,
        "cascade_einsum": lambda: cascade_attention(
            q, k_shared, v_shared, k_rest, v_rest, mask, scale
        ),
        "cascade_decode": lambda: cascade_decode(
            q, k_shared, v_shared, k_rest, v_rest, bias, scale
        ),
    }
    want = dense()
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    for fn in ways.values():
        torch.testing.assert_close(fn(), want, **tol)

    def repeat(fn):
        return lambda: [fn() for _ in range(calls)]

    return {name: repeat(fn) for name, fn in ways.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    rows = []
    for batch, prefix, rest in SHAPES:
        times = interleaved_times(case(batch, prefix, rest, args.calls, dtype), args.repeats)
        us = {name: 1e6 * statistics.median(ts) / args.calls for name, ts in times.items()}
        rows.append(
            {
                "dtype": args.dtype,
                "batch": batch,
                "prefix": prefix,
                "rest": rest,
                **{f"{name}_us": round(t, 1) for name, t in us.items()},
                "dense_vs_decode": round(us["dense"] / us["cascade_decode"], 2),
                "einsum_vs_decode": round(us["cascade_einsum"] / us["cascade_decode"], 2),
                "uses_cascade": (batch - 1) * prefix >= CASCADE_MIN_SAVED_POSITIONS,
            }
        )
    print_table(rows, list(rows[0]))
    append_results("attention_bench", rows)


if __name__ == "__main__":
    main()
