"""Calibration for weight forms that round activations too (models/weights/quantized.py): each
linear's largest input magnitude per input channel over one float forward of a fixed text, as
SmoothQuant calibrates. Channels that carry outliers are then scaled down in the activations
and up in the weights before both round to 8 bits, so 7-bit activation steps are not set by a
few large channels. The vocabulary projection stays weight-only and is not calibrated."""

from __future__ import annotations

import torch

from ..models.decoder import DecoderForCausalLM
from ..models.layers import Linear
from .attention import TorchAttnBackend
from .forward_batch import ForwardBatch
from .memory import KVPool

# Prose, code, JSON and a chat turn: the kinds of text agent programs send.
CALIBRATION_TEXT = (
    "The lighthouse keeper climbed the spiral stairs each evening, polished the great lens "
    "and wrote the weather into a leather log book. Storms came from the west in autumn.\n"
    "def mean(values: list[float]) -> float:\n    return sum(values) / len(values)\n"
    '{"name": "get_weather", "arguments": {"city": "Berlin", "unit": "celsius", "days": 3}}\n'
    "<|im_start|>user\nWhich planet is closest to the Sun? Answer with one word.<|im_end|>\n"
    "<|im_start|>assistant\nMercury.<|im_end|>\n"
    "Question: What is 6 times 7?\nA. 42\nB. 36\nAnswer: A\n"
    "In 1887 the committee approved 3 new bridges, 12 roads and a harbour wall of 240 m."
)
NUM_FALLBACK_IDS = 192  # a model without a tokenizer sees a fixed spread of ids


def calibration_ids(tokenizer, vocab_size: int) -> list[int]:
    if tokenizer is not None:
        return tokenizer.encode(CALIBRATION_TEXT)
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab_size, (NUM_FALLBACK_IDS,), generator=g).tolist()


@torch.inference_mode()
def input_maxima(model: DecoderForCausalLM, ids: list[int]) -> dict[Linear, torch.Tensor]:
    """Linear -> [in_features] float32: max |input| per channel over one prefill of `ids`
    (every linear but the vocabulary projection)."""
    cfg, device = model.cfg, model.embed_tokens.weight.device
    n = len(ids)
    num_kv_heads = model.layout.num_kv_heads
    pool = KVPool(n + 1, cfg.num_layers, num_kv_heads, cfg.head_dim, model.dtype, device)
    req_to_token = torch.zeros((1, n + 1), dtype=torch.int32, device=device)
    slots = torch.arange(1, n + 1, dtype=torch.int32, device=device)  # slot 0 is padding
    req_to_token[0, :n] = slots
    fb = ForwardBatch.build(req_to_token, [0], [0], [ids], slots, None, device)
    maxima: dict[Linear, torch.Tensor] = {}

    def record(module: Linear, inputs: tuple[torch.Tensor, ...], _output: torch.Tensor) -> None:
        seen = inputs[0].detach().abs().amax(dim=0).float()
        maxima[module] = torch.maximum(maxima[module], seen) if module in maxima else seen

    linears = [m for m in model.modules() if isinstance(m, Linear) and m is not model.lm_head]
    hooks = [m.register_forward_hook(record) for m in linears]
    try:
        model(fb, pool, TorchAttnBackend())
    finally:
        for hook in hooks:
            hook.remove()
    return maxima
