"""The engine thread loads the model as well as stepping it (runtime/engine.py): the caller's
thread opens no OpenMP team of its own beside the engine's, and a failed load still raises
in the constructor, with nothing left running."""

from __future__ import annotations

import threading

import pytest
from stemma.runtime import engine as engine_module
from stemma.runtime.engine import Engine

OPTS = {"dtype": "float32", "kv_cache_mb": 8}


def test_the_model_loads_and_runs_on_the_engine_thread(tiny_llama_dir, monkeypatch):
    seen: dict[str, threading.Thread] = {}

    def record(name, fn):
        def wrapped(*args, **kwargs):
            seen[name] = threading.current_thread()
            return fn(*args, **kwargs)

        monkeypatch.setattr(engine_module, name, wrapped)

    record("resolve_dtype", engine_module.resolve_dtype)
    record("resolve_checkpoint", engine_module.resolve_checkpoint)
    record("load_runner", engine_module.load_runner)
    record("build_core", engine_module.build_core)
    with Engine(str(tiny_llama_dir), **OPTS) as engine:
        out = engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 4})
        assert out["meta_info"]["completion_tokens"] == 4
        step_thread = engine._call(threading.current_thread)
    assert set(seen) == {"resolve_dtype", "resolve_checkpoint", "load_runner", "build_core"}
    assert all(t is step_thread for t in seen.values()), seen
    assert step_thread is not threading.current_thread()


def test_a_failed_load_raises_in_the_constructor(tiny_llama_dir, monkeypatch):
    def fail(*args, **kwargs):
        raise ValueError("no such weights: blocks.0.wq")

    monkeypatch.setattr(engine_module, "load_runner", fail)
    before = {t for t in threading.enumerate() if t.name == "stemma-engine"}
    with pytest.raises(ValueError, match="no such weights: blocks.0.wq"):
        Engine(str(tiny_llama_dir), **OPTS)
    after = {t for t in threading.enumerate() if t.name == "stemma-engine"}
    assert after <= before  # the thread that failed to load has ended


def test_an_interrupt_during_the_load_reaches_the_caller(tiny_llama_dir, monkeypatch):
    """BaseExceptions too (a KeyboardInterrupt raised inside the load) end the constructor."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(engine_module, "load_runner", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Engine(str(tiny_llama_dir), **OPTS)
