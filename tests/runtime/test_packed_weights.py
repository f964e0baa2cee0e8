"""CPU bfloat16: weights packed for oneDNN (with norms folded and ops fused) stay accurate."""

from __future__ import annotations

import pytest
import torch
from stemma.runtime import dtype_policy
from stemma.runtime.dtype_policy import can_pack_bf16_weights
from stemma.runtime.models.layers import Linear
from stemma.runtime.weight_plan import Measured, plan_weights

from .test_model_vs_hf import GreedyDriver

# Packed weights run oneDNN's bfloat16 kernels, which exist only on CPUs with native bfloat16
# (a kernel, not a decision: it cannot be faked). The tests that need no packed kernel run
# everywhere, and the one that runs both ways fakes "no packing" to take the plain branch.
needs_packing = pytest.mark.skipif(
    not can_pack_bf16_weights(),
    reason="oneDNN has no bfloat16 kernels on this CPU (no AVX512-BF16 / AMX)",
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


@needs_packing
@pytest.mark.parametrize("ckpt_name", ["tiny_llama_dir", "tiny_qwen2_dir"])
def test_packed_weights_as_accurate_as_plain_weights(
    ckpt_name: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packing folds the norm scales into the next linear and fuses the residual add, silu and
    gate * up product into the matmuls, so bf16 rounds at other places than with plain weights.
    Both are measured against float32: packed must be as close to it as plain bf16 is."""
    ckpt = request.getfixturevalue(ckpt_name)  # qwen2: qkv bias and tied embeddings
    reference = _prefill_logits(GreedyDriver(ckpt, dtype="float32"))
    packed = GreedyDriver(ckpt, dtype="bfloat16")
    model = packed.runner.model
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert linears and all(m.form.name == "packed" for m in linears)
    assert all(
        layer.input_layernorm.weight is None and layer.post_attention_layernorm.weight is None
        for layer in model.layers
    )
    unpacked = plan_weights(None, "bfloat16", "cpu", Measured(can_pack=False))
    plain = GreedyDriver(ckpt, dtype="bfloat16", plan=unpacked)
    linears = [m for m in plain.runner.model.modules() if isinstance(m, Linear)]
    assert not any(m.form.name == "packed" for m in linears)
    err_packed = (_prefill_logits(packed) - reference).abs()
    err_plain = (_prefill_logits(plain) - reference).abs()
    assert float(err_plain.mean()) > 0  # bf16 does round: the comparison means something
    assert float(err_packed.mean()) <= 1.2 * float(err_plain.mean())
    assert float(err_packed.max()) <= 1.5 * float(err_plain.max())


@needs_packing
def test_packed_greedy_ids_follow_float32_where_the_choice_is_clear(tiny_llama_dir) -> None:
    """Greedy decoding on packed weights picks float32's token wherever float32's top two
    logits are further apart than bf16 rounding moves them (twice the largest error above)."""
    reference = _prefill_logits(GreedyDriver(tiny_llama_dir, dtype="float32"))
    packed = _prefill_logits(GreedyDriver(tiny_llama_dir, dtype="bfloat16"))
    top2 = reference.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.5
    assert int(clear.sum()) >= len(reference) // 4
    assert torch.equal(packed.argmax(-1)[clear], reference.argmax(-1)[clear])


def test_float32_weights_stay_plain(tiny_llama_dir) -> None:
    driver = GreedyDriver(tiny_llama_dir, dtype="float32")
    linears = [m for m in driver.runner.model.modules() if isinstance(m, Linear)]
    assert not any(m.form.name == "packed" for m in linears)


@pytest.mark.parametrize("weights", [pytest.param("packed", marks=needs_packing), "plain"])
def test_plain_greedy_reads_bf16_logits_and_chooses_as_float32(
    tiny_llama_dir, harness_factory, make_prompts, monkeypatch, weights
) -> None:
    """Plain greedy rows take the argmax of the model's bf16 logits (exact: widening is
    exact); a row that wants logprobs gets float32 logits. Both choose the same ids. On
    packed weights, and on plain ones (oneDNN's packing faked away where it exists)."""
    from stemma.runtime.sampling.sampler import Sampler

    if weights == "plain":
        monkeypatch.setattr(dtype_policy, "can_pack_bf16_weights", lambda: False)

    seen: list[torch.dtype] = []
    real_sample = Sampler.sample

    def spy(self, logits, *args, **kwargs):
        seen.append(logits.dtype)
        return real_sample(self, logits, *args, **kwargs)

    monkeypatch.setattr(Sampler, "sample", spy)
    prompts = make_prompts([5, 12, 30], 384, seed=6)
    outputs = {}
    for mode, extra in [("plain", {}), ("logprobs", {"logprob": {"return_logprob": True}})]:
        h = harness_factory(tiny_llama_dir, dtype="bfloat16", max_total_tokens=1024)
        linears = [m for m in h.runner.model.modules() if isinstance(m, Linear)]
        assert all((m.form.name == "packed") == (weights == "packed") for m in linears)
        reqs = [h.add(f"{mode}{i}", p, max_new_tokens=6, **extra) for i, p in enumerate(prompts)]
        seen.clear()
        h.run()
        assert set(seen) == {torch.bfloat16 if mode == "plain" else torch.float32}
        outputs[mode] = [r.output_ids for r in reqs]
    assert outputs["plain"] == outputs["logprobs"]


def test_a_packed_weight_takes_the_lowest_number_no_live_form_holds() -> None:
    """A packed weight's number is a constant of the compiled graph, so of Inductor's cache
    key: a model's weights take the same numbers whatever forms came and went before them in
    the process (the weight plan's trial forms at a first start), so that the next start,
    which makes no trial forms, asks for the graphs the first one cached."""
    import gc

    from stemma.runtime.models.weights import dense

    class Form:  # any object a finalizer can watch: the numbering needs no packed kernel
        pass

    trials = [Form() for _ in range(5)]
    taken = [dense._hold(form, torch.zeros(1)) for form in trials]
    assert len(set(taken)) == 5 and all(dense._HELD[n] is not None for n in taken)
    del trials
    gc.collect()
    assert not set(taken) & set(dense._HELD)  # each left with its form
    model = [Form() for _ in range(3)]
    assert [dense._hold(form, torch.zeros(1)) for form in model] == sorted(taken)[:3]
