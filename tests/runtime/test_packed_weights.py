"""CPU bfloat16: linear weights held in oneDNN's blocked layout give the plain weights' logits."""

from __future__ import annotations

import pytest
import torch
from stemma.runtime import model_runner
from stemma.runtime.models.layers import Linear, can_pack_weights

from .test_model_vs_hf import GreedyDriver

pytestmark = pytest.mark.skipif(
    not can_pack_weights(torch.device("cpu"), torch.bfloat16),
    reason="this torch build has no oneDNN bfloat16 matmul",
)

PROMPTS = [[5, 9, 13, 21, 8, 2, 40, 41], [7, 7, 30], list(range(10, 60))]


def _prefill_logits(driver: GreedyDriver) -> torch.Tensor:
    rows = [driver.runner.req_to_token_pool.alloc() for _ in PROMPTS]
    slots = [s for r, p in zip(rows, PROMPTS) for s in driver.slots_for(r, 0, len(p))]
    # Every position's logits: rows of 3 to 50 tokens exercise small and large matmuls.
    fb = driver.runner.build_batch(
        rows, [0] * len(PROMPTS), PROMPTS, slots, [list(range(len(p))) for p in PROMPTS]
    )
    return driver.runner.forward(fb)


@pytest.mark.parametrize("ckpt_name", ["tiny_llama_dir", "tiny_qwen2_dir"])
def test_packed_weights_match_plain_weights(
    ckpt_name: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = request.getfixturevalue(ckpt_name)  # qwen2: qkv bias and tied embeddings
    packed = GreedyDriver(ckpt, dtype="bfloat16")
    linears = [m for m in packed.runner.model.modules() if isinstance(m, Linear)]
    assert linears and all(m.weight.is_mkldnn for m in linears)
    monkeypatch.setattr(model_runner, "can_pack_weights", lambda device, dtype: False)
    plain = GreedyDriver(ckpt, dtype="bfloat16")
    assert not any(
        m.weight.is_mkldnn for m in plain.runner.model.modules() if isinstance(m, Linear)
    )
    torch.testing.assert_close(
        _prefill_logits(packed), _prefill_logits(plain), rtol=2e-2, atol=2e-2
    )
    assert packed.generate(PROMPTS)[0] == plain.generate(PROMPTS)[0]


def test_float32_weights_stay_plain(tiny_llama_dir) -> None:
    driver = GreedyDriver(tiny_llama_dir, dtype="float32")
    assert not any(
        m.weight.is_mkldnn for m in driver.runner.model.modules() if isinstance(m, Linear)
    )
