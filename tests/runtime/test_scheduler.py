"""Scheduler behaviour step by step: cached_tokens, stops, the memory invariant under churn.
Tests of scheduling alone run on a fake model (conftest.FakeRunner): the real pools and
batches, no weights."""

from __future__ import annotations

import random

import pytest


def test_same_prompt_twice_caches_all_but_one(tiny_llama_dir, harness_factory, make_prompts):
    h = harness_factory(tiny_llama_dir, fake_model=True, max_total_tokens=1024)
    [p] = make_prompts([40], 384, 1)
    first = h.add("a", p, max_new_tokens=2)
    h.run()
    second = h.add("b", p, max_new_tokens=2)
    h.run()
    assert first.cached_tokens == 0
    assert second.cached_tokens == len(p) - 1
    assert second.output_ids == first.output_ids


@pytest.mark.parametrize("page_size", [1, 4])
def test_shared_prefix_reports_its_length(tiny_llama_dir, harness_factory, make_prompts, page_size):
    h = harness_factory(tiny_llama_dir, fake_model=True, max_total_tokens=1024, page_size=page_size)
    shared, a_tail, b_tail = make_prompts([23, 5, 6], 384, 2)
    h.add("a", shared + a_tail, max_new_tokens=1)
    h.run()
    b = h.add("b", shared + b_tail, max_new_tokens=1)
    h.run()
    assert b.cached_tokens == 23 - 23 % page_size


def test_shared_uncached_prefix_computed_once_per_round(
    tiny_llama_dir, harness_factory, make_prompts
):
    h = harness_factory(
        tiny_llama_dir, fake_model=True, max_total_tokens=2048, chunked_prefill_size=512
    )
    shared, *tails = make_prompts([64, 3, 4, 5], 384, 3)
    for i, t in enumerate(tails):
        h.add(f"q{i}", shared + t, max_new_tokens=1)
    h.step()
    assert h.steps[0] == {"q0": 67}  # the others wait a round instead of recomputing the prefix
    h.run()
    assert h.steps[1] == {"q1": 4, "q2": 5}


def test_chunk_budget_limits_each_step(tiny_llama_dir, harness_factory, make_prompts):
    h = harness_factory(
        tiny_llama_dir,
        fake_model=True,
        max_total_tokens=2048,
        chunked_prefill_size=32,
        max_prefill_tokens=40,
    )
    a, b = make_prompts([70, 20], 384, 4)
    h.add("a", a, max_new_tokens=2)
    h.add("b", b, max_new_tokens=2)
    h.run()
    assert h.steps[0] == {"a": 32, "b": 8}
    assert all(sum(n for n in s.values() if n > 1) <= 40 for s in h.steps)


def test_stop_string_spanning_two_tokens_stops_and_trims(
    tiny_llama_dir, harness_factory, make_prompts
):
    h = harness_factory(tiny_llama_dir, max_total_tokens=1024)
    [p] = make_prompts([8], 384, 5)
    free = h.add("free", p, max_new_tokens=12)
    h.run()
    tok = h.tokenizer
    pieces = [tok.decode([t]) for t in free.output_ids]
    i = next(
        i
        for i in range(3, 11)
        if pieces[i] and pieces[i + 1] and pieces[i].isprintable() and pieces[i + 1].isprintable()
    )
    stop = pieces[i][-1] + pieces[i + 1][0]  # straddles tokens i and i + 1
    text_before = "".join(pieces[: i + 1])
    stopped = h.add("stopped", p, max_new_tokens=12, stop=[stop])
    h.run()
    assert stopped.finish.to_dict() == {"type": "stop", "matched": stop}
    assert stopped.output_ids == free.output_ids[: len(stopped.output_ids)]
    from stemma.runtime.response import final_text

    text = final_text(tok, stopped)
    assert stop not in text
    assert text_before.startswith(text) and (text + stop).startswith(text_before[: len(text) + 1])


def test_min_new_tokens_holds_off_eos(tiny_llama_dir, harness_factory, make_prompts):
    h = harness_factory(tiny_llama_dir, max_total_tokens=1024)
    [p] = make_prompts([6], 384, 6)
    eos = min(h.tokenizer.eos_token_ids)
    bias = {str(eos): 100.0}
    eager = h.add("eager", p, max_new_tokens=10, ignore_eos=False, logit_bias=bias)
    held = h.add("held", p, max_new_tokens=10, ignore_eos=False, logit_bias=bias, min_new_tokens=4)
    h.run()
    assert eager.output_ids == [eos]
    assert len(held.output_ids) == 5 and held.output_ids[-1] == eos
    assert eos not in held.output_ids[:4]
    assert held.finish.to_dict() == {"type": "stop", "matched": eos}


def test_memory_invariant_under_random_churn(tiny_llama_dir, harness_factory):
    """600 requests: random lengths, shared prefixes, stops, aborts, a pool small enough to
    evict and retract; the slot invariant is checked after every step (by the harness)."""
    rng = random.Random(0)
    h = harness_factory(
        tiny_llama_dir,
        fake_model=True,
        dtype="float32",
        max_total_tokens=400,
        page_size=1,
        chunked_prefill_size=48,
        max_prefill_tokens=96,
        max_running_requests=24,
    )
    systems = [[rng.randrange(3, 384) for _ in range(rng.randrange(5, 60))] for _ in range(6)]
    pending = list(range(600))
    live: list[str] = []
    while pending or h.scheduler.running or h.scheduler.waiting:
        for _ in range(rng.randrange(0, 6)):
            if pending:
                i = pending.pop()
                prompt = rng.choice(systems) + [
                    rng.randrange(3, 384) for _ in range(rng.randrange(1, 30))
                ]
                params = {"max_new_tokens": rng.randrange(0, 24)}
                if rng.random() < 0.3:
                    params["stop_token_ids"] = [rng.randrange(3, 384) for _ in range(20)]
                if rng.random() < 0.3:
                    params.update(temperature=1.0, seed=i)
                h.add(f"r{i}", prompt, **params)
                live.append(f"r{i}")
        if live and rng.random() < 0.1:
            rid = live.pop(rng.randrange(len(live)))
            h.scheduler.abort(rid, "test abort")
            h.scheduler.check_memory()
        h.step()
    assert h.scheduler.num_retractions > 0
    assert h.scheduler.tree.evictable_size > 0
    h.scheduler.flush_cache()
    h.scheduler.check_memory()
    assert h.runner.allocator.num_free == h.runner.allocator.capacity


def test_flush_cache_refused_while_requests_wait(tiny_llama_dir, harness_factory):
    h = harness_factory(tiny_llama_dir, fake_model=True, max_total_tokens=256)
    h.add("a", [5, 6, 7], max_new_tokens=3)
    with pytest.raises(RuntimeError, match="flush_cache refused"):
        h.scheduler.flush_cache()
