"""Triton kernels, each beside a plain-torch `<op>_ref` that is its specification.

Pure functions of tensors; this package imports only torch and triton. Names load lazily, so
`import stemma.kernels` stays cheap and TRITON_INTERPRET=1 can still be set before first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "decode_attention": "decode_attn",
    "decode_attention_ref": "decode_attn",
    "extend_attention": "extend_attn",
    "extend_attention_ref": "extend_attn",
    "apply_token_bitmask": "token_bitmask",
    "apply_token_bitmask_ref": "token_bitmask",
    "unpack_token_bitmask": "token_bitmask",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
