"""A GGUF's Q4_0 / Q4_1 linears load into the int4 kernel from their own blocks: the codes and
scales llama.cpp wrote, not a re-quantization of their float32 dequantization."""

from __future__ import annotations

import json

import pytest
import torch
from stemma.runtime.dtype_policy import can_pack_bf16_weights
from stemma.runtime.engine import Engine
from stemma.runtime.models import loader
from stemma.runtime.models.gguf_convert import INT4_BLOCKS_FILE
from stemma.runtime.models.gguf_int4 import (
    gguf_int4_blocks,
    int4_from_gguf_blocks,
    unpack_nibbles,
)
from stemma.runtime.models.loader import load_decoder, resolve_checkpoint
from stemma.runtime.models.weights import quantize

from .gguf_writer import write_gguf

NUM_LINEARS = 8  # the tiny llama: 2 layers x (q|k|v, o, gate|up, down)


@pytest.fixture(params=["Q4_0", "Q4_1"])
def quantized_gguf(request, tiny_llama_dir, tmp_path):
    return request.param, write_gguf(tiny_llama_dir, tmp_path / "model.gguf", request.param)


def test_blocks_are_the_files_weights(quantized_gguf, tmp_path):
    kind, path = quantized_gguf
    ckpt = resolve_checkpoint(str(path), tmp_path / "cache")
    blocks = gguf_int4_blocks(ckpt)
    net, _ = load_decoder(ckpt, torch.float32, "cpu")
    # model.safetensors holds the GGUF's weights dequantized; the blocks give them again
    # (q/k rows un-permuted alike).
    q = "model.layers.0.self_attn.q_proj.weight"
    codes = unpack_nibbles(blocks[f"{q}.codes"]).float()
    scale = blocks[f"{q}.scale"].repeat_interleave(32, dim=1)
    minimum = blocks[f"{q}.min"].repeat_interleave(32, dim=1)
    rows = blocks[f"{q}.codes"].shape[0]
    torch.testing.assert_close(
        minimum + codes * scale, net.layers[0].self_attn.qkv_proj.weight[:rows]
    )
    given = int4_from_gguf_blocks(net, blocks)
    assert len(given) == net.num_linears == NUM_LINEARS
    direct_err = requant_err = 0.0
    for linear, qw in given.items():
        w = linear.weight.detach()
        direct = qw.dequantize() - w
        # Only the kernel's bfloat16 scale and zero round: within 2^-8 of each group's range.
        group_range = w.view(w.shape[0], -1, 32).abs().amax(-1).repeat_interleave(32, dim=1)
        assert bool((direct.abs() <= 2**-7 * group_range + 1e-6).all())
        direct_err += direct.pow(2).sum().item()
        requant_err += (quantize(w, "int4").dequantize() - w).pow(2).sum().item()
    if kind == "Q4_0":  # symmetric blocks: min / max re-quantization picks another grid
        assert direct_err < 0.5 * requant_err
    else:  # Q4_1's grid is min / max already: re-quantizing finds the same codes
        assert direct_err <= requant_err * (1 + 1e-6)


def test_engine_reports_and_uses_the_blocks(quantized_gguf, tmp_path, make_prompts):
    _, path = quantized_gguf
    cache = tmp_path / "cache"
    engine = Engine(model=str(path), quantization="int4", cache_dir=str(cache))
    try:
        info = engine.get_model_info()
        assert info["quantization"] == "int4"
        assert info["weights_note"].startswith(f"{NUM_LINEARS} of {NUM_LINEARS} linears")
        [prompt] = make_prompts([12], 384, seed=3)
        params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
        out = engine.generate(input_ids=[prompt], sampling_params=params)[0]
        assert len(out["output_ids"]) == 6
        net = engine.runner.model
        ckpt = resolve_checkpoint(str(path), cache)
        want = int4_from_gguf_blocks(net, gguf_int4_blocks(ckpt))
        for linear in (net.layers[0].self_attn.qkv_proj, net.layers[1].mlp.down_proj):
            assert torch.equal(linear.form.dequantize(), want[linear].dequantize())
    finally:
        engine.shutdown()


def test_an_older_conversion_is_converted_again(tiny_llama_dir, tmp_path):
    path = write_gguf(tiny_llama_dir, tmp_path / "model.gguf", "Q4_1")
    ckpt = resolve_checkpoint(str(path), tmp_path / "cache")
    # A conversion from before the blocks were kept: no marker, no blocks file.
    (ckpt / loader.CONVERSION_MARKER).unlink()
    (ckpt / INT4_BLOCKS_FILE).unlink()
    again = resolve_checkpoint(str(path), tmp_path / "cache")
    assert again == ckpt and (ckpt / INT4_BLOCKS_FILE).exists()
    marker = json.loads((ckpt / loader.CONVERSION_MARKER).read_text())
    assert marker == {"version": loader.CONVERSION_VERSION}
    # A current one is read as it is.
    stamp = (ckpt / "config.json").stat().st_mtime_ns
    assert resolve_checkpoint(str(path), tmp_path / "cache") == ckpt
    assert (ckpt / "config.json").stat().st_mtime_ns == stamp


def _dispatches_by_rows_and_generates(engine: Engine, linear, in_features: int) -> None:
    """`linear`'s FewRowsWeight (limit 2) multiplies 1 and 2 rows by its few form and 3 by
    its many form; the engine then decodes."""
    form = linear.form
    for rows, used in ((1, form.few), (2, form.few), (3, form.many)):
        x = torch.randn(rows, in_features, dtype=engine.runner.model.dtype)
        assert torch.equal(linear(x), used.matmul(x))
    params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    out = engine.generate(input_ids=[[5, 9, 13, 2, 7]], sampling_params=params)[0]
    assert len(out["output_ids"]) == 6


def test_auto_multiplies_steps_of_few_rows_by_the_blocks(tiny_llama_dir, tmp_path, monkeypatch):
    """dtype "auto" with no quantization named: the GGUF's own blocks for the steps of at
    most the measured rows (injected: 2), the dtype's form for larger ones; drafting prices
    the steps on each side of that limit apart."""
    from stemma.runtime.models.weights import few_rows

    path = write_gguf(tiny_llama_dir, tmp_path / "model.gguf", "Q4_1")
    monkeypatch.setattr(few_rows, "own_int4_rows", lambda *args, **kw: 2)
    cache = str(tmp_path / "cache")
    engine = Engine(model=str(path), cache_dir=cache, speculative_algorithm="NGRAM")
    try:
        assert list(engine.outputs.budget.cost.limits) == [2]
        info = engine.get_model_info()
        assert info["quantization"] is None
        assert "steps of <= 2 rows multiply the GGUF's own int4 blocks" in info["dtype_reason"]
        assert info["weights_note"] == (
            f"{NUM_LINEARS} of {NUM_LINEARS} linears packed from the GGUF's own 4-bit blocks, "
            f"for steps of <= 2 rows ({engine.runner.plan.linear_form} for the others)"
        )
        net = engine.runner.model
        ckpt = resolve_checkpoint(str(path), tmp_path / "cache")
        want = int4_from_gguf_blocks(net, gguf_int4_blocks(ckpt))
        linear = net.layers[1].mlp.down_proj
        form = linear.form
        assert isinstance(form, few_rows.FewRowsWeight) and form.max_rows == 2
        assert torch.equal(form.few.dequantize(), want[linear].dequantize())
        _dispatches_by_rows_and_generates(engine, linear, linear.form.few.in_features)
    finally:
        engine.shutdown()


def test_auto_multiplies_a_q8_0_vocabulary_as_int8_at_few_rows(
    tiny_llama_dir, tmp_path, monkeypatch
):
    """A GGUF whose vocabulary is Q8_0: under dtype "auto" its projection multiplies steps of
    at most the measured rows (injected: 2) as per-row int8, the vocabulary form the others;
    a file with a float vocabulary, or `--quantization none`, never measures it."""
    from stemma.runtime.models.weights import few_rows
    from stemma.runtime.models.weights.quantized import Int8Weight

    path = write_gguf(tiny_llama_dir, tmp_path / "model.gguf", "Q4_1", vocab_quant="Q8_0")
    monkeypatch.setattr(few_rows, "own_int8_vocab_rows", lambda *args, **kw: 2)
    engine = Engine(model=str(path), cache_dir=str(tmp_path / "cache"))
    try:
        info = engine.get_model_info()
        assert (
            "the vocabulary: steps of <= 2 rows multiply the GGUF's own int8"
            in info["dtype_reason"]
        )
        assert (
            "the vocabulary projection as per-row int8 from the GGUF's Q8_0" in info["weights_note"]
        )
        head = engine.runner.model.lm_head
        form = head.form
        assert isinstance(form, few_rows.FewRowsWeight) and isinstance(form.few, Int8Weight)
        assert form.max_rows == 2 and form.many.name == engine.runner.plan.vocab_form
        _dispatches_by_rows_and_generates(engine, head, engine.runner.model.cfg.hidden_size)
    finally:
        engine.shutdown()
    monkeypatch.setattr(few_rows, "own_int8_vocab_rows", lambda *a, **k: pytest.fail("measured"))
    for gguf, kwargs in (("Q4_1", {}), ("Q4_1", {"quantization": "none"})):
        plain = write_gguf(tiny_llama_dir, tmp_path / f"{len(kwargs)}.gguf", gguf)
        engine = Engine(model=str(plain), cache_dir=str(tmp_path / "cache"), **kwargs)
        try:
            assert not isinstance(engine.runner.model.lm_head.form, few_rows.FewRowsWeight)
        finally:
            engine.shutdown()


@pytest.mark.parametrize("kwargs", [{"quantization": "none"}, {"dtype": "float32"}])
def test_none_or_an_explicit_dtype_computes_dequantized(
    kwargs, tiny_llama_dir, tmp_path, monkeypatch
):
    from stemma.runtime.models.weights import few_rows

    path = write_gguf(tiny_llama_dir, tmp_path / "model.gguf", "Q4_1")
    monkeypatch.setattr(few_rows, "own_int4_rows", lambda *a, **k: pytest.fail("measured"))
    engine = Engine(model=str(path), cache_dir=str(tmp_path / "cache"), **kwargs)
    try:
        info = engine.get_model_info()
        assert info["quantization"] == kwargs.get("quantization")
        assert info["weights_note"] is None and "own" not in info["dtype_reason"]
        forms = {type(m.form) for m in engine.runner.model.modules() if hasattr(m, "form")}
        assert few_rows.FewRowsWeight not in forms
    finally:
        engine.shutdown()


def test_quantization_none_is_a_name_and_others_are_refused():
    from stemma.runtime.config import EngineConfig

    assert EngineConfig(quantization="none", tp_size=2).quantization == "none"
    with pytest.raises(ValueError, match=r"quantization must be one of .*'none'.*got 'int2'"):
        EngineConfig(quantization="int2")


@pytest.mark.skipif(not can_pack_bf16_weights(), reason="no oneDNN bfloat16 kernels here")
def test_steps_of_few_rows_compute_as_int4_beside_folded_norms(
    tiny_llama_dir, tmp_path, monkeypatch
):
    """Packed bfloat16 folds each norm's scale into its linear; the own blocks cannot hold it,
    so their steps multiply it in: a layer's one-row step equals --quantization int4's."""
    from stemma.runtime.models.weights import few_rows

    path = write_gguf(tiny_llama_dir, tmp_path / "model.gguf", "Q4_1")
    monkeypatch.setattr(few_rows, "own_int4_rows", lambda *args, **kw: 8)
    cache = str(tmp_path / "cache")
    auto = Engine(model=str(path), cache_dir=cache)
    int4 = Engine(model=str(path), cache_dir=cache, quantization="int4")
    try:
        assert (
            auto.runner.plan.linear_form == "packed" and auto.runner.model.dtype == torch.bfloat16
        )
        a, b = auto.runner.model.layers[0], int4.runner.model.layers[0]
        assert a.input_layernorm.weight is None and b.input_layernorm.weight is not None
        x = torch.randn(1, a.self_attn.qkv_proj.form.few.in_features, dtype=torch.bfloat16)
        cos_sin = auto.runner.model.ropes["full_attention"].table(torch.tensor([3]))
        for got, want in zip(a.before_attention(x, *cos_sin), b.before_attention(x, *cos_sin)):
            torch.testing.assert_close(got, want)
        o = torch.randn(1, a.self_attn.num_heads, a.self_attn.head_dim, dtype=torch.bfloat16)
        torch.testing.assert_close(a.after_attention(o, x), b.after_attention(o, x))
    finally:
        auto.shutdown()
        int4.shutdown()
