"""The bound on oneDNN's per-shape caches (runtime/cpu_caches.py): set before an engine runs
anything, the user's own settings kept, a bad value refused by name."""

from __future__ import annotations

import pytest
from stemma.runtime.cpu_caches import (
    CACHE_ENVS,
    CAPACITY_ENV,
    DEFAULT_CAPACITY,
    bound_onednn_caches,
)
from stemma.runtime.engine import Engine


@pytest.fixture
def clean_env(monkeypatch):
    for name in (CAPACITY_ENV, *CACHE_ENVS):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_both_caches_get_the_default_capacity(clean_env):
    import os

    assert bound_onednn_caches() == DEFAULT_CAPACITY
    assert [os.environ[name] for name in CACHE_ENVS] == [str(DEFAULT_CAPACITY)] * 2


def test_the_stemma_variable_sets_both_and_a_users_own_setting_wins(clean_env):
    import os

    clean_env.setenv(CAPACITY_ENV, "256")
    clean_env.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "7")
    assert bound_onednn_caches() == 256
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "7"
    assert os.environ["LRU_CACHE_CAPACITY"] == "256"


@pytest.mark.parametrize("bad", ["lots", "-3", "1.5"])
def test_a_bad_capacity_is_refused_by_name(clean_env, bad):
    clean_env.setenv(CAPACITY_ENV, bad)
    with pytest.raises(ValueError, match=f"{CAPACITY_ENV}='{bad}'.*0 or more"):
        bound_onednn_caches()


def test_an_engine_sets_the_bound(clean_env, tiny_llama_dir):
    import os

    with Engine(str(tiny_llama_dir), dtype="float32", max_total_tokens=256):
        assert [os.environ[name] for name in CACHE_ENVS] == [str(DEFAULT_CAPACITY)] * 2
