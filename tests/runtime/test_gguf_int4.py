"""A GGUF's Q4_0 / Q4_1 linears load into the int4 kernel from their own blocks: the codes and
scales llama.cpp wrote, not a re-quantization of their float32 dequantization."""

from __future__ import annotations

import json

import pytest
import torch
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
