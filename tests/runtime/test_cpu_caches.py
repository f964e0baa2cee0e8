"""Bounds on CPU memory (runtime/cpu_caches.py): oneDNN's per-shape caches bounded before an
engine runs anything, the user's own settings kept, a bad value refused by name; the heap
trimmed every so many steps and whenever the engine goes idle."""

from __future__ import annotations

import time

import pytest
from stemma.runtime import cpu_caches
from stemma.runtime.cpu_caches import (
    CACHE_ENVS,
    CAPACITY_ENV,
    DEFAULT_CAPACITY,
    HeapTrimmer,
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


def test_the_heap_is_trimmed_every_so_many_steps_and_on_release():
    calls = []
    heap = HeapTrimmer(every=3, trim=lambda pad: calls.append(pad) or 1)
    for _ in range(7):
        heap.after_step()
    assert calls == [0, 0] and heap.steps_since_trim == 1
    heap.release()
    assert calls == [0, 0, 0] and heap.num_trims == 3 and heap.steps_since_trim == 0
    with pytest.raises(ValueError, match="every=0"):
        HeapTrimmer(every=0)


def test_glibcs_malloc_trim_is_found_and_runs():
    """On glibc (every machine this project runs on) the real call is made."""
    trim = cpu_caches.load_malloc_trim()
    assert trim is not None
    assert trim(0) in (0, 1)


def test_an_idle_engine_trims_after_its_steps(monkeypatch, tiny_llama_dir):
    calls = []
    monkeypatch.setattr(cpu_caches, "load_malloc_trim", lambda: calls.append)
    with Engine(str(tiny_llama_dir), dtype="float32", max_total_tokens=256) as engine:
        engine.generate("hello", {"max_new_tokens": 3})
        deadline = time.monotonic() + 30  # a hang bound only
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert calls and calls[0] == 0
        assert engine.heap.steps_since_trim == 0
