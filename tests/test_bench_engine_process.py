"""bench/common.EngineProcess: an Engine in a child process of its own, for A/Bs that must not
hold two engines in one process. Calls, attributes and errors cross the pipe; a failed load
raises in the parent."""

from __future__ import annotations

import pytest
from stemma.bench.common import EngineProcess

OPTS = {"dtype": "float32", "kv_cache_mb": 8}


def test_calls_and_attributes_cross_the_pipe(tiny_llama_dir):
    engine = EngineProcess(str(tiny_llama_dir), **OPTS)
    try:
        params = {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}
        out = engine.call("generate", input_ids=[[1, 2, 3], [4, 5]], sampling_params=params)
        assert [o["meta_info"]["completion_tokens"] for o in out] == [3, 3]
        assert engine.attr("vocab_size") == engine.call("get_model_info")["vocab_size"]
        assert engine.attr("runner.plan.linear_form")
        with pytest.raises(RuntimeError, match="ValueError"):  # bad input, named
            engine.call("generate", input_ids=[1], sampling_params={"max_new_tokens": -1})
        assert engine.call("tokenize", "hello")  # the child still serves after an error
        # Read as on an Engine: methods call over the pipe, other attributes come as copies.
        assert engine.tokenize("hello") == engine.call("tokenize", "hello")
        assert engine.dtype.name == "float32"
        assert engine.config.kv_cache_mb == 8
    finally:
        engine.shutdown()
    assert not engine._proc.is_alive()


def test_a_failed_load_raises_in_the_parent(tmp_path):
    with pytest.raises(RuntimeError, match="engine process: "):
        EngineProcess(str(tmp_path / "no-such-model"), **OPTS)
