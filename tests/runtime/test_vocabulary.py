"""The constrained-decoding vocabulary: exact token bytes, every special/control token and EOS
left out, and a fingerprint that changes with the content."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from stemma.runtime.constrained.vocabulary import (
    Vocabulary,
    byte_level_token_bytes,
    gpt2_bytes_to_unicode,
)
from stemma.runtime.tokenizer import Tokenizer
from tokenizers import Tokenizer as FastTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers


def test_byte_map_is_the_byte_level_alphabet() -> None:
    table = gpt2_bytes_to_unicode()
    assert sorted(table) == list(range(256))
    assert set(table.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert byte_level_token_bytes("Ġcat") == b" cat"
    assert byte_level_token_bytes("ä½ł") == "你".encode()
    assert byte_level_token_bytes("a b") is None  # a raw space is not in the alphabet


def test_smollm2_leaves_out_every_control_token_and_eos(
    smollm_tokenizer: Any, smollm_vocab: Vocabulary
) -> None:
    left_out = {i for i, data in enumerate(smollm_vocab.token_bytes) if data is None}
    controls = set(smollm_tokenizer.control_token_ids)
    assert len(controls) == 17 and controls | set(smollm_tokenizer.eos_token_ids) <= left_out
    raw = smollm_tokenizer._tok.get_vocab(with_added_tokens=False)
    with_nul = {i for t, i in raw.items() if b"\0" in (byte_level_token_bytes(t) or b"")}
    assert left_out == controls | with_nul
    assert smollm_vocab.vocab_size == smollm_tokenizer.vocab_size == 49152
    assert smollm_vocab.end_marker_id == 49152


def test_token_bytes_decode_like_the_tokenizer(
    smollm_tokenizer: Any, smollm_vocab: Vocabulary
) -> None:
    for token_id in range(17, smollm_vocab.vocab_size, 37):
        data = smollm_vocab.token_bytes[token_id]
        assert data
        text = smollm_tokenizer.decode([token_id])
        assert data.decode("utf-8", errors="replace") == text


def test_fingerprint_tracks_content(smollm_tokenizer: Any, smollm_vocab: Vocabulary) -> None:
    again = Vocabulary.from_tokenizer(smollm_tokenizer)
    assert again.fingerprint == smollm_vocab.fingerprint and len(again.fingerprint) == 32
    changed = list(smollm_vocab.token_bytes)
    changed[100] = b"x"
    assert Vocabulary(changed, smollm_vocab.eos_token_ids).fingerprint != smollm_vocab.fingerprint
    other_eos = Vocabulary(list(smollm_vocab.token_bytes), frozenset({0}))
    assert other_eos.fingerprint != smollm_vocab.fingerprint


def test_tiny_byte_level_tokenizer(tmp_path: Path) -> None:
    fast = FastTokenizer(models.BPE())
    fast.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    fast.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    fast.train_from_iterator(['{"name": "Paris"} 日本語 cat cats'] * 8, trainer)
    fast.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    tokenizer = Tokenizer(tmp_path)
    vocab = Vocabulary.from_tokenizer(tokenizer)
    assert vocab.vocab_size == tokenizer.vocab_size and vocab.eos_token_ids == {2}
    nul = fast.token_to_id(gpt2_bytes_to_unicode()[0])
    assert {i for i, data in enumerate(vocab.token_bytes) if data is None} == {0, 1, 2, nul}
    assert len(vocab.single_byte_ids()) == 255  # every byte but NUL, the end marker


def test_rejects_non_byte_level_tokenizers_and_missing_eos(tmp_path: Path) -> None:
    fast = FastTokenizer(models.WordLevel({"a": 0, "<eos>": 1, "<unk>": 2}, unk_token="<unk>"))
    fast.decoder = decoders.Metaspace()
    fast.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))
    with pytest.raises(ValueError, match="byte-level"):
        Vocabulary.from_tokenizer(Tokenizer(tmp_path))
    with pytest.raises(ValueError, match="EOS"):
        Vocabulary([b"a"], frozenset())
