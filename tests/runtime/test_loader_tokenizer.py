"""Loader strictness, the GGUF cache, the tokenizer's chat roles and incremental detokenizing."""

from __future__ import annotations

import random
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from stemma.runtime.models.loader import load_model, resolve_checkpoint
from stemma.runtime.tokenizer import IncrementalDetokenizer, Tokenizer


def copy_ckpt(src, dst, edit):
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_unknown_tensor_raises(tiny_llama_dir, tmp_path):
    bad = copy_ckpt(
        tiny_llama_dir,
        tmp_path / "x",
        lambda t: t.__setitem__("model.extra.weight", torch.zeros(2)),
    )
    with pytest.raises(ValueError, match="unknown tensor 'model.extra.weight'"):
        load_model(str(bad))


def test_missing_tensor_raises(tiny_llama_dir, tmp_path):
    bad = copy_ckpt(tiny_llama_dir, tmp_path / "x", lambda t: t.pop("model.norm.weight"))
    with pytest.raises(ValueError, match="lacks 1 tensors"):
        load_model(str(bad))


def test_wrong_shape_raises(tiny_llama_dir, tmp_path):
    def edit(t):
        t["model.norm.weight"] = torch.zeros(3)

    with pytest.raises(ValueError, match="has shape"):
        load_model(str(copy_ckpt(tiny_llama_dir, tmp_path / "x", edit)))


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(ValueError, match="neither a built-in name"):
        resolve_checkpoint("no-such-model")


def test_builtin_model_warm_resolve_is_cached(monkeypatch: pytest.MonkeyPatch):
    """A warm resolve neither converts nor re-hashes (checked by refusing both, not by
    timing them)."""
    from stemma.runtime.models import gguf_convert, loader

    first = resolve_checkpoint("smollm2-135m")
    monkeypatch.setattr(loader, "file_sha256", lambda path: pytest.fail("re-hashed"))
    monkeypatch.setattr(gguf_convert, "convert_gguf", lambda *a: pytest.fail("re-converted"))
    again = resolve_checkpoint("smollm2-135m")
    assert again == first and (again / "model.safetensors").exists()


@pytest.fixture(scope="module")
def smol_tok():
    return Tokenizer(resolve_checkpoint("smollm2-135m"))


def test_smollm2_tokenizer_and_template(smol_tok):
    assert smol_tok.eos_token_ids == frozenset({2})
    assert len(smol_tok.control_token_ids) == 17
    text = smol_tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    roles = smol_tok.chat_roles()
    assert roles.roles["user"] == ("<|im_start|>user\n", "<|im_end|>\n")
    assert roles.roles["assistant"] == ("<|im_start|>assistant\n", "<|im_end|>\n")
    assert roles.default_system_prompt.startswith("You are a helpful AI assistant named SmolLM")


@pytest.mark.parametrize("text", ["naïve café 日本語 🙂🙂 done", "€€€ ∑∫ 𝔘𝔫𝔦"])
def test_incremental_detokenization_never_splits_characters(smol_tok, text):
    ids = smol_tok.encode(text)
    detok = IncrementalDetokenizer(smol_tok)
    pieces = [detok.push([t]) for t in ids]
    pieces.append(detok.flush())
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    # The case under test happens: some character's bytes are split across tokens.
    assert any(smol_tok.decode([t]) == "\ufffd" for t in ids)


def _window_detokenize(tok, ids_per_push, skip):
    """The detokenizer DecodeStream replaced: decode a window of ids and emit only what extends
    the decode of its first part, holding back while the text ends in U+FFFD."""
    ids, prefix, read, out = [], 0, 0, []
    for new in ids_per_push:
        ids += new
        prefix_text = tok.decode(ids[prefix:read], skip)
        new_text = tok.decode(ids[prefix:], skip)
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            out.append("")
            continue
        prefix, read = read, len(ids)
        out.append(new_text[len(prefix_text) :])
    return out


@pytest.mark.parametrize("skip", [True, False])
def test_stream_detokenizer_matches_window_decoding(smol_tok, skip):
    """Mixed UTF-8, emoji, CJK and special tokens, one id and several ids per push: every
    delta equals the window algorithm's."""
    texts = [
        "naïve café 日本語 🙂🙂 done",
        "<|im_start|>user\nПривет 👩‍👩‍👧‍👦 مرحبا<|im_end|>\n<|im_start|>assistant\n漢字😀",
        "ｆｕｌｌｗｉｄｔｈ ㈱ 🇫🇷🇯🇵 €∑∫ 𝔘𝔫𝔦\t\n  end",
    ]
    rng = random.Random(0)
    sequences = [smol_tok.encode(t) for t in texts]
    sequences += [[rng.randrange(smol_tok.vocab_size) for _ in range(30)] for _ in range(40)]
    assert any(t in smol_tok.control_token_ids for ids in sequences for t in ids)
    for ids in sequences:
        for max_push in (1, 3):
            pushes, i = [], 0
            while i < len(ids):
                n = rng.randint(1, max_push)
                pushes.append(ids[i : i + n])
                i += n
            detok = IncrementalDetokenizer(smol_tok, skip)
            assert [detok.push(p) for p in pushes] == _window_detokenize(smol_tok, pushes, skip)
