"""Shared fixtures: tiny random-init checkpoints built offline in a temp dir (tests/fixtures.py
builds them), the HF reference, prompts, the scheduler harness and the step gate."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from .fixtures import HFReference, build_tiny_checkpoint

# Hypothesis by default fails an example that runs past 200 ms and a test whose data takes
# "too long" to generate: wall-clock checks that a slow or busy machine can trip with correct
# code. Both are off; a hang is still bounded by the run's own limits.
settings.register_profile("stemma", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("stemma")

# The two speed measurements behind dtype "auto"'s weight plan on CPUs without native bfloat16
# (weight_plan.plan_weights over dtype_policy.MachineMeasurements). Measured for real, their
# verdict would depend on how fast and how busy this CPU is, and it changes the numerics of
# every engine built with dtype "auto" (float16 weights, bfloat16 copies for small steps, or
# neither). Tests get a fixed verdict instead, "neither wins" (auto float32 computes as
# explicit float32); the tests of the decision inject their own verdicts, and the measuring
# code itself runs on tiny sizes through the real_speed_measurements fixture.
_MEASURED_VERDICTS = {"fp16_weights_win": False, "bfloat16_small_step_rows": 0}
# ... and whether a GGUF's own 4-bit blocks (or its Q8_0 vocabulary as int8) beat the
# dtype's form at few rows: "at no rows" (the built-in model computes in its dtype alone);
# tests of the choice inject their own.
_OWN_BLOCK_ROWS = 0


@pytest.fixture(scope="session", autouse=True)
def _no_speed_measurements():
    """Session-wide, so that module- and session-scoped engines get the fixed verdicts too.
    Yields each replaced function: {(module, name): the original}."""
    import stemma.runtime.dtype_policy as policy
    from stemma.runtime import measured
    from stemma.runtime.models.weights import few_rows

    verdicts = {(policy, name): verdict for name, verdict in _MEASURED_VERDICTS.items()}
    verdicts[(few_rows, "own_int4_rows")] = _OWN_BLOCK_ROWS
    verdicts[(few_rows, "own_int8_vocab_rows")] = _OWN_BLOCK_ROWS
    originals = {key: getattr(*key) for key in verdicts}
    with pytest.MonkeyPatch.context() as mp:
        for (module, name), verdict in verdicts.items():
            mp.setattr(module, name, lambda *args, _v=verdict, **kw: _v)
        mp.setattr(measured, "KEEP", False)  # no fixed verdict kept for a real engine to read
        yield originals


@pytest.fixture
def real_speed_measurements(_no_speed_measurements, monkeypatch):
    """The real measuring functions back, for one test (of the measuring code itself)."""
    for (module, name), fn in _no_speed_measurements.items():
        monkeypatch.setattr(module, name, fn)
    return _no_speed_measurements


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-qwen2")
    return build_tiny_checkpoint(out, "Qwen2Config", tie_word_embeddings=True)


class FakeRunner:
    """A model runner without a model, for tests of scheduling alone: the real slot pools and
    ForwardBatch, and logits that put every row's weight on a token that is a pure function
    of the row's input token and position (so outputs repeat exactly, as greedy ones do)."""

    def __init__(self, cfg, vocab_size: int, context_len: int = 2048):
        import torch
        from stemma.runtime.executor.memory import ReqToTokenPool, SlotAllocator
        from stemma.runtime.executor.model_runner import ModelRunner

        self.build_batch = ModelRunner.build_batch.__get__(self)  # the runner's own packing
        self.device = torch.device("cpu")
        self.cfg, self.vocab_size, self.context_len = cfg, vocab_size, context_len
        self.allocator = SlotAllocator(cfg.max_total_tokens or 4096, cfg.page_size)
        self.req_to_token_pool = ReqToTokenPool(
            cfg.max_running_requests, context_len + cfg.page_size
        )
        self.weights_note = None

    def forward(self, fb):
        import torch

        ids, pos = fb.input_ids[fb.logits_idx], fb.positions[fb.logits_idx]
        picked = (ids * 31 + pos * 7 + 3) % (self.vocab_size - 3) + 3  # ids 0-2: specials
        logits = torch.zeros(len(picked), self.vocab_size)
        return logits.scatter_(1, picked[:, None], 10.0)


class SchedulerHarness:
    """The engine's parts without its thread: tests add requests and call step() themselves,
    checking the memory invariant after every step. fake_model: a FakeRunner instead of the
    checkpoint's model (its tokenizer and vocabulary still come from `ckpt`)."""

    def __init__(self, ckpt: Path, fake_model: bool = False, **config):
        import torch
        from stemma.runtime.config import EngineConfig
        from stemma.runtime.dtype_policy import resolve_dtype
        from stemma.runtime.engine_core import build_core, load_runner
        from stemma.runtime.tokenizer import Tokenizer

        config.setdefault("dtype", "float64")
        self.cfg = EngineConfig(model=str(ckpt), **config)
        if fake_model:
            self.tokenizer = Tokenizer(ckpt)
            self.vocab_size = self.tokenizer.vocab_size
            self.runner = FakeRunner(self.cfg, self.vocab_size)
        else:  # the engine's own assembly, its weight plan included
            dtype = resolve_dtype(self.cfg.dtype, self.cfg.device)
            loaded, self.runner, _ = load_runner(self.cfg, self.cfg.model, dtype)
            self.tokenizer = loaded.tokenizer
            self.vocab_size = loaded.config.vocab_size
        # The engine's own assembly: the same sampler, output processor and scheduler.
        self.core = build_core(self.cfg, self.runner, self.tokenizer, self.vocab_size)
        self.scheduler, self.outputs = self.core.scheduler, self.core.outputs
        self.steps: list[dict[str, int]] = []
        torch.manual_seed(0)

    def add(self, rid: str, ids: list[int], **params):
        from stemma.runtime.sampling.params import SamplingParams
        from stemma.runtime.sampling.sampler import SamplingState
        from stemma.runtime.scheduler.req import LogprobRequest, Req

        logprob = LogprobRequest(**params.pop("logprob", {}))
        sp = SamplingParams.from_dict({"temperature": 0, "ignore_eos": True, **params})
        req = Req(rid, list(ids), sp, SamplingState.create(sp, ids, self.vocab_size), logprob)
        self.scheduler.add(req)
        return req

    def step(self) -> None:
        batch = self.core.step()
        self.steps.append(batch.describe())
        self.scheduler.check_memory()

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.scheduler.has_work:
                return
            self.step()
        raise AssertionError("requests did not finish")


@pytest.fixture(scope="session")
def harness_factory():
    return SchedulerHarness


@pytest.fixture(scope="session")
def hf_ref():
    return HFReference()


def random_prompts(lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="session")
def make_prompts():
    return random_prompts


class StepGate:
    """Holds an engine's loop before a step until the test releases it: lets `free` steps
    run, then the next one waits (with `when`, the first step at which when() is true waits
    instead; it runs on the engine thread, between steps, so it may read the scheduler's
    queues). A request cannot finish on its own meanwhile, however fast this CPU is, and
    commands sent to the engine (an abort) are seen right after the held step, since the loop
    drains its inbox between steps. With tensor parallelism the gate holds rank 0's loop;
    the other ranks wait for its next step as they do while the engine is idle."""

    def __init__(
        self, engine, monkeypatch: pytest.MonkeyPatch, free: int, when: Callable | None = None
    ) -> None:
        self.free, self.when = free, when
        self.released, self.held = threading.Event(), threading.Event()
        real = engine.core.step

        def step():
            if not self.released.is_set() and self._hold_now():
                self.held.set()
                assert self.released.wait(60), "the test never released the engine"
            return real()

        monkeypatch.setattr(engine.core, "step", step)

    def _hold_now(self) -> bool:
        if self.when is not None:
            return bool(self.when())
        if self.free > 0:
            self.free -= 1
            return False
        return True

    def release(self) -> None:
        self.released.set()


@pytest.fixture
def step_gate(monkeypatch: pytest.MonkeyPatch):
    """step_gate(engine, free=n) or step_gate(engine, when=predicate): a StepGate on
    `engine`, released and removed after the test (a failed test leaves no engine held)."""
    gates: list[StepGate] = []

    def make(engine, free: int = 0, when: Callable | None = None) -> StepGate:
        gates.append(StepGate(engine, monkeypatch, free, when))
        return gates[-1]

    yield make
    for gate in gates:
        gate.release()
