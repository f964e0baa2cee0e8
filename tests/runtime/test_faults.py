"""Test-only fault switches: each makes the engine fail where production failures happen, and
the engine survives it: the requests hit fail with a message, every slot comes back, the next
requests run normally. Off by default."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from stemma.runtime.constrained import vocabulary
from stemma.runtime.constrained.vocabulary import CompileError, CompileLimits, IndexCompiler
from stemma.runtime.engine import Engine
from stemma.runtime.faults import Faults

GREEDY = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def faulty_engine(tiny_llama_dir: Path) -> Any:
    engine = Engine(
        str(tiny_llama_dir), dtype="float32", max_total_tokens=2048, enable_fault_injection=True
    )
    engine.check_invariants = True
    yield engine
    engine.shutdown()


def _all_slots_back(engine: Engine) -> None:
    state = engine.memory_state()
    assert state["invariant_ok"], state["violation"]
    assert state["locked"] == state["private"] == 0
    assert state["free"] + state["evictable"] == state["capacity"]
    assert state["rows_free"] == state["rows_total"]


def test_switches_are_off_unless_enabled(tiny_llama_dir: Path) -> None:
    faults = Faults()
    with pytest.raises(RuntimeError, match="fault injection is off"):
        faults.arm("forward_error")
    assert not faults.take("forward_error")
    on = Faults(enabled=True)
    with pytest.raises(ValueError, match="unknown fault 'nope'"):
        on.arm("nope")
    on.arm("forward_error", 2)
    assert [on.take("forward_error") for _ in range(3)] == [True, True, False]
    assert on.state() == {"armed": {}, "fired": {"forward_error": 2}}


def test_forward_error_fails_the_batch_and_the_engine_goes_on(faulty_engine: Engine) -> None:
    before = faulty_engine.generate("a b c d", GREEDY)
    prompts = [f"prompt {i} " * (i + 1) for i in range(4)]
    faulty_engine.inject_fault("forward_error")
    outs = faulty_engine.generate(prompts, GREEDY)
    finishes = [o["meta_info"]["finish_reason"] for o in outs]
    assert all(f["type"] == "abort" for f in finishes), finishes
    assert all("injected fault" in f["message"] for f in finishes)
    _all_slots_back(faulty_engine)
    after = faulty_engine.generate("a b c d", GREEDY)
    assert after["text"] == before["text"]
    _all_slots_back(faulty_engine)


def test_forward_error_mid_decode_frees_every_slot(faulty_engine: Engine, step_gate) -> None:
    """The engine is held after the first token until the fault is armed, so the fault
    fires in the next step whatever this CPU's speed (the 32 tokens cannot finish first)."""
    gate = step_gate(faulty_engine, free=1)
    stream = faulty_engine.generate("x y z", GREEDY | {"max_new_tokens": 32}, stream=True)
    first = next(stream)
    assert first["meta_info"]["finish_reason"] is None
    faulty_engine.inject_fault("forward_error")
    gate.release()
    chunks = list(stream)
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert "injected fault" in chunks[-1]["meta_info"]["finish_reason"]["message"]
    assert len(chunks[-1]["output_ids"]) == 1  # failed in the step right after the first token
    _all_slots_back(faulty_engine)


def test_killed_compile_worker_is_replaced_and_the_compile_retried(smollm_vocab: Any) -> None:
    faults = Faults(enabled=True)
    compiler = IndexCompiler(smollm_vocab.to_binary(), CompileLimits(), faults)
    try:
        faults.arm("compile_kill")
        assert compiler.compile("(yes|no)\\x00")
        assert faults.state()["fired"] == {"compile_kill": 1}
        faults.arm("compile_kill", 2)  # dies on the retry too: the request's error says so
        with pytest.raises(CompileError, match="compile worker died twice"):
            compiler.compile("(maybe|never)\\x00")
        assert compiler.compile("(maybe|never)\\x00")
    finally:
        compiler.kill()


def test_hung_compile_worker_times_out_and_the_next_compile_works(
    smollm_vocab: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hung worker's timeout passes on a fake clock (no wall-clock wait); the fresh
    worker's real compile has a limit no machine comes near (it takes milliseconds)."""
    waited: list[float] = []
    monkeypatch.setattr(vocabulary, "time", SimpleNamespace(sleep=waited.append))
    faults = Faults(enabled=True)
    compiler = IndexCompiler(smollm_vocab.to_binary(), CompileLimits(timeout_s=60.0), faults)
    try:
        faults.arm("compile_hang")
        with pytest.raises(CompileError, match="longer than the 60 s limit"):
            compiler.compile("(red|green)\\x00")
        assert waited == [60.0]
        assert compiler.compile("(red|green)\\x00")
    finally:
        compiler.kill()
