"""Each family's tiny model written as GGUF (llama.cpp's layout, gguf package) and loaded back
through the streaming converter gives HF's greedy ids."""

from __future__ import annotations

import pytest

from ..fixtures import build_tiny_checkpoint
from .families import FAMILIES, hf_attention
from .gguf_writer import write_gguf
from .test_model_vs_hf import GreedyDriver

# llama.cpp scales Gemma's queries by key_length ** -0.5; these families keep that.
GGUF_FAMILIES = ["llama3", "qwen2.5-yarn", "qwen3", "mistral", "phi3", "gemma2", "gemma3"]


@pytest.mark.parametrize("family", GGUF_FAMILIES)
def test_gguf_round_trip_gives_hf_ids(family, tmp_path, monkeypatch, hf_ref, make_prompts):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config_name, extra = FAMILIES[family]
    if "query_pre_attn_scalar" in extra:
        extra = {**extra, "query_pre_attn_scalar": 16}
    ckpt = build_tiny_checkpoint(tmp_path / "hf", config_name, **extra)
    gguf_path = write_gguf(ckpt, tmp_path / "model.gguf")
    prompts = make_prompts([27, 5], 384, seed=31)
    outs, _ = GreedyDriver(gguf_path).generate(prompts, n=8)
    attn = hf_attention(extra)
    assert outs == [hf_ref.greedy(ckpt, p, 8, attn_implementation=attn) for p in prompts]
