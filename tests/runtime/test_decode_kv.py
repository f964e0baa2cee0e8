"""DecodeKV: the dense K/V copy a run of decode steps carries gives the pool gather's logits."""

from __future__ import annotations

import torch
from stemma.runtime.executor.attention import DecodeKV

from .test_model_vs_hf import GreedyDriver

LENGTHS = [1, 3, 7, 16, 17, 30, 64, 5]  # mixed: padded contexts, so the mask matters


class Stepper:
    """Prefills prompts, then decodes step by step, recording each step's logits and how the
    backend used its decode copy."""

    def __init__(self, ckpt, prompts: list[list[int]]):
        self.driver = GreedyDriver(ckpt)
        self.runner = self.driver.runner
        self.rows = [self.runner.req_to_token_pool.alloc() for _ in prompts]
        self.lens = [len(p) for p in prompts]
        logits = self._forward(self.rows, [0] * len(prompts), prompts)
        self.last = logits.argmax(-1).tolist()

    def _forward(self, rows, prefix_lens, chunks) -> torch.Tensor:
        slots = [
            s
            for r, p, c in zip(rows, prefix_lens, chunks)
            for s in self.driver.slots_for(r, p, len(c))
        ]
        return self.runner.forward(self.runner.build_batch(rows, prefix_lens, chunks, slots))

    def decode(self, keep: list[int]) -> tuple[torch.Tensor, str | None]:
        """One decode step for the requests at indices `keep` (all still running)."""
        rows = [self.rows[i] for i in keep]
        logits = self._forward(rows, [self.lens[i] for i in keep], [[self.last[i]] for i in keep])
        for i, t in zip(keep, logits.argmax(-1).tolist()):
            self.lens[i] += 1
            self.last[i] = t
        return logits, self.runner.attn.dense


def _run(ckpt, prompts, schedule: list[list[int]]):
    stepper = Stepper(ckpt, prompts)
    return [stepper.decode(keep) for keep in schedule]


def test_decode_run_appends_and_matches_the_gather(tiny_llama_dir, make_prompts, monkeypatch):
    prompts = make_prompts(LENGTHS, 384, seed=3)
    everyone = list(range(len(prompts)))
    fewer = everyone[1:]
    # A run, a request leaves (the batch changes: a new run), the smaller run goes on.
    schedule = [everyone] * 4 + [fewer] * 3
    carried = _run(tiny_llama_dir, prompts, schedule)
    assert [mode for _, mode in carried] == ["start", "append", "append", "append"] + [
        "start",
        "append",
        "append",
    ]
    monkeypatch.setattr(DecodeKV, "BUDGET_BYTES", 0)  # every step gathers from the pool
    gathered = _run(tiny_llama_dir, prompts, schedule)
    for (a, _), (b, _) in zip(carried, gathered):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_over_budget_gathers_every_step(tiny_llama_dir, make_prompts, monkeypatch):
    prompts = make_prompts(LENGTHS, 384, seed=4)
    monkeypatch.setattr(DecodeKV, "BUDGET_BYTES", 0)
    stepper = Stepper(tiny_llama_dir, prompts)
    for _ in range(3):
        stepper.decode(list(range(len(prompts))))
        kv = stepper.runner.attn.decode_kv
        assert kv.rows is None and kv.k == []


def test_run_regrows_past_its_headroom(tiny_llama_dir, make_prompts):
    """A run outgrowing its capacity (longest context + HEADROOM) starts over, with room."""
    prompts = make_prompts([4, 9], 384, seed=5)
    stepper = Stepper(tiny_llama_dir, prompts)
    modes = [stepper.decode([0, 1])[1] for _ in range(DecodeKV.HEADROOM + 6)]
    assert modes[0] == "start" and modes.count("start") == 2
    # The first step's longest context is 10, so capacity 10 + HEADROOM lasts HEADROOM more.
    regrow = modes.index("start", 1)
    assert regrow == DecodeKV.HEADROOM + 1
    assert all(m == "append" for i, m in enumerate(modes) if i not in (0, regrow))
