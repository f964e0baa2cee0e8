"""Which part of a checkpoint tensor a parameter takes: all of it, or (tensor parallelism)
ranges along one dimension, read straight from a safetensors slice so a rank reads only its
rows or columns. Shapes are checked against the whole tensor the model expects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .layers import Linear, MergedLinear


@dataclass(slots=True)
class Shard:
    """dst takes the checkpoint tensor whole (dim None), or the ranges `parts` along `dim` of
    a tensor `full` long there, concatenated; a shorter result fills the front of a zeroed
    dst (the last vocabulary shard's padding)."""

    dst: torch.Tensor
    dim: int | None = None
    full: int = 0
    parts: list[tuple[int, int]] | None = None

    def load(self, name: str, src: Any) -> None:
        """src: a torch tensor or a safetensors slice (indexing it reads only that part)."""
        shape = tuple(src.shape) if isinstance(src, torch.Tensor) else tuple(src.get_shape())
        dst = self.dst.data
        expected = list(dst.shape)
        if self.dim is not None:
            expected[self.dim] = self.full
        if shape != tuple(expected):
            raise ValueError(f"tensor {name!r} has shape {shape}, expected {tuple(expected)}")
        if self.dim is None:
            dst.copy_(src[...] if isinstance(src, torch.Tensor) else src[:])
            return
        lead = (slice(None),) * self.dim
        part = torch.cat([src[(*lead, slice(a, b))] for a, b in self.parts], dim=self.dim)
        n = part.shape[self.dim]
        if n != dst.shape[self.dim]:
            dst.zero_()
        dst.narrow(self.dim, 0, n).copy_(part)


def shift(r: tuple[int, int], by: int) -> tuple[int, int]:
    return (r[0] + by, r[1] + by)


def add_linear(
    t: dict[str, Shard], prefix: str, lin: Linear, dim: int, full: int, parts: list
) -> None:
    """A linear split along dim: 0, its output rows (column-parallel); 1, its input columns
    (row-parallel, whose bias is whole)."""
    t[prefix + ".weight"] = Shard(lin.weight, dim, full, parts)
    if lin.bias is not None:
        t[prefix + ".bias"] = Shard(lin.bias, 0, full, parts) if dim == 0 else Shard(lin.bias)


def add_parts(
    t: dict[str, Shard], prefix: str, merged: MergedLinear, names: dict[str, tuple[int, tuple]]
) -> None:
    """Each stacked part of a merged linear under its own checkpoint name:
    names[name] = (its whole length, this rank's row range)."""
    for kind in ["weight"] + (["bias"] if merged.bias is not None else []):
        for j, (name, (full, rows)) in enumerate(names.items()):
            t[f"{prefix}{name}.{kind}"] = Shard(merged.part(j, kind), 0, full, [rows])
