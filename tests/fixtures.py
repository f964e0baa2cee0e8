"""What tests share beside pytest's fixtures: the tiny checkpoint builder (any transformers
family, random weights, a BPE tokenizer trained on TINY_CORPUS) and the HF greedy reference.
Plain functions and classes; tests/conftest.py wraps them in fixtures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TINY_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? Paris is the capital of France.",
    "def add(a, b):\n    return a + b\n",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 3.14 -7",
    "Unicode: café, naïve, 日本語, emoji 🙂.",
]

# Every tiny checkpoint's dimensions; a family's own switches go on top.
TINY_CONFIG: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
)

# transformers config class name -> its causal LM class name
MODEL_CLASSES = {
    "LlamaConfig": "LlamaForCausalLM",
    "Qwen2Config": "Qwen2ForCausalLM",
    "Qwen3Config": "Qwen3ForCausalLM",
    "MistralConfig": "MistralForCausalLM",
    "Gemma2Config": "Gemma2ForCausalLM",
    "Gemma3TextConfig": "Gemma3ForCausalLM",
    "Phi3Config": "Phi3ForCausalLM",
}


def write_tiny_tokenizer(
    out: Path, vocab_size: int = 384, extra_specials: tuple[str, ...] = ()
) -> int:
    """A byte-level BPE tokenizer trained on TINY_CORPUS, with a ChatML template; returns
    its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *extra_specials]
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
        json.dumps(
            {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": template}
        )
    )
    return tok.get_vocab_size()


def save_random_model(model: Any, out: Path) -> Path:
    """Re-initialize `model` (a HF model, built just after torch.manual_seed) larger than its
    default, so random logits are well separated (no near-ties), and save it into out."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
            else:  # norm weights and biases
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out)
    return out


def build_tiny_checkpoint(
    out: Path,
    config_name: str = "LlamaConfig",
    seed: int = 0,
    vocab_size: int = 384,
    **config: Any,
) -> Path:
    """A tiny random model of transformers' `config_name` (TINY_CONFIG, then `config`) and the
    tiny BPE tokenizer, saved into out."""
    import torch
    import transformers

    args = {**TINY_CONFIG, "vocab_size": write_tiny_tokenizer(out, vocab_size), **config}
    torch.manual_seed(seed)
    config_cls = getattr(transformers, config_name)
    model = getattr(transformers, MODEL_CLASSES[config_name])(config_cls(**args))
    return save_random_model(model, out)


def hf_greedy(model: Any, prompt: list[int], n: int) -> tuple[list[int], Any]:
    """HF's own `generate(do_sample=False)` of exactly n tokens after one prompt: the ids and
    the logits, [n, vocab]."""
    import torch

    out = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    return out.sequences[0, len(prompt) :].tolist(), torch.cat(out.logits)


class HFReference:
    """HF transformers in float64 on a checkpoint: greedy ids, their logits and prompt
    logprobs. Models are loaded once per (checkpoint, loading options), greedy runs once per
    (prompt, n)."""

    def __init__(self) -> None:
        self.models: dict[tuple, Any] = {}
        self.runs: dict[tuple, tuple[list[int], Any]] = {}

    def model(self, ckpt: Path | str, **load: Any) -> Any:
        """`load` goes to from_pretrained (an attn_implementation)."""
        import torch
        from transformers import AutoModelForCausalLM

        key = (str(ckpt), *sorted(load.items()))
        if key not in self.models:
            model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float64, **load)
            self.models[key] = model.eval()
        return self.models[key]

    def greedy_logits(
        self, ckpt: Path | str, prompt: list[int], n: int, **load: Any
    ) -> tuple[list[int], Any]:
        """(ids, logits [n, vocab]) of greedy decoding (see hf_greedy)."""
        key = (str(ckpt), *sorted(load.items()), tuple(prompt), n)
        if key not in self.runs:
            self.runs[key] = hf_greedy(self.model(ckpt, **load), prompt, n)
        return self.runs[key]

    def greedy(self, ckpt: Path | str, prompt: list[int], n: int, **load: Any) -> list[int]:
        return list(self.greedy_logits(ckpt, prompt, n, **load)[0])

    def prompt_logprobs(self, ckpt: Path | str, prompt: list[int]) -> list[float]:
        """log p(prompt[i] | prompt[:i]) for i >= 1."""
        import torch

        with torch.no_grad():
            logits = self.model(ckpt)(torch.tensor([prompt])).logits[0]
        lp = torch.log_softmax(logits, dim=-1)
        return [lp[i - 1, prompt[i]].item() for i in range(1, len(prompt))]
