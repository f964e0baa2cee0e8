"""Shared fixtures: tiny random-init Llama-family checkpoints built offline in a temp dir."""

from __future__ import annotations

from pathlib import Path

import pytest

TINY_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? Paris is the capital of France.",
    "def add(a, b):\n    return a + b\n",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 3.14 -7",
    "Unicode: café, naïve, 日本語, emoji 🙂.",
]


def build_tiny_checkpoint(
    out: Path, arch: str = "llama", vocab_size: int = 384, tie: bool = False, seed: int = 0
) -> Path:
    """A tiny random model plus a byte-level BPE tokenizer trained on TINY_CORPUS."""
    import json

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TINY_CORPUS * 4, trainer)
    tok.save(str(out / "tokenizer.json"))
    template = (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
        "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    (out / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": template})
    )
    common = dict(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    # Larger-than-default init so random logits are well separated (no near-ties).
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
            else:  # norm weights and biases
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen2"), arch="qwen2", tie=True)
