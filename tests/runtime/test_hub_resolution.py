"""A hub id resolves through the huggingface_hub cache, offline, from a temp HF_HOME."""

from __future__ import annotations

import shutil

import pytest
import torch
from stemma.runtime.models.loader import load_model, resolve_checkpoint

from .families import build_family

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def prefill_hub_cache(hf_home, repo_id: str, src) -> None:
    """huggingface_hub's cache layout: refs/main names a snapshot holding the files."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(src, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)


@pytest.fixture()
def offline_hub(tmp_path, monkeypatch):
    hf_home = tmp_path / "hf-home"
    prefill_hub_cache(hf_home, "acme/tiny-qwen3", build_family(tmp_path / "src", "qwen3"))
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hf_home, tmp_path / "src"


def test_hub_id_loads_offline_from_the_cache(offline_hub):
    hf_home, src = offline_hub
    ckpt = resolve_checkpoint("acme/tiny-qwen3", hf_home / "stemma")
    assert ckpt == hf_home / "hub" / "models--acme--tiny-qwen3" / "snapshots" / COMMIT
    hub, local = load_model("acme/tiny-qwen3"), load_model(str(src))
    assert hub.config == local.config and hub.config.arch == "Qwen3ForCausalLM"
    mine, theirs = hub.model.state_dict(), local.model.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


def test_missing_hub_id_offline_fails_naming_it(offline_hub):
    with pytest.raises(ValueError, match="'acme/absent'.*HF_HUB_OFFLINE"):
        resolve_checkpoint("acme/absent")
