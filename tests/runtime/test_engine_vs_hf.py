"""Greedy ids through the scheduler and the Engine equal HF transformers (float64 tiny model)."""

from __future__ import annotations

import pytest
from stemma.runtime.engine import Engine
from stemma.runtime.executor import attention

N = 10


def test_sixteen_requests_arriving_at_different_steps(
    tiny_llama_dir, harness_factory, hf_ref, make_prompts
):
    h = harness_factory(
        tiny_llama_dir, max_total_tokens=4096, chunked_prefill_size=32, max_prefill_tokens=64
    )
    prompts = make_prompts([3, 50, 7, 1, 33, 12, 90, 5, 18, 64, 2, 40, 9, 27, 71, 15], 384, 7)
    reqs = []
    for i, p in enumerate(prompts):  # one new arrival per step, while others decode
        reqs.append(h.add(f"r{i}", p, max_new_tokens=N))
        h.step()
    h.run()
    assert [r.output_ids for r in reqs] == [hf_ref.greedy(tiny_llama_dir, p, N) for p in prompts]
    assert any(len(s) > 1 and max(s.values()) > 1 and 1 in s.values() for s in h.steps), (
        "some step should mix a prefill chunk with decodes"
    )


def test_cache_hit_for_most_of_the_prompt(tiny_llama_dir, harness_factory, hf_ref, make_prompts):
    h = harness_factory(tiny_llama_dir, max_total_tokens=4096)
    shared, tail = make_prompts([60, 4], 384, 8)
    h.add("a", shared, max_new_tokens=3)
    h.run()
    b = h.add("b", shared + tail, max_new_tokens=N)
    h.run()
    assert b.cached_tokens == 60
    assert h.steps[-N] == {"b": 4}  # only the uncached tail was computed
    assert b.output_ids == hf_ref.greedy(tiny_llama_dir, shared + tail, N)


def test_prompt_longer_than_chunk(tiny_llama_dir, harness_factory, hf_ref, make_prompts):
    h = harness_factory(tiny_llama_dir, max_total_tokens=4096, chunked_prefill_size=16)
    [p] = make_prompts([45], 384, 9)
    r = h.add("long", p, max_new_tokens=N)
    h.run()
    assert h.steps[:3] == [{"long": 16}, {"long": 16}, {"long": 13}]
    assert r.output_ids == hf_ref.greedy(tiny_llama_dir, p, N)


def test_retraction_under_a_tiny_pool(tiny_llama_dir, harness_factory, hf_ref, make_prompts):
    h = harness_factory(tiny_llama_dir, max_total_tokens=120, chunked_prefill_size=64)
    prompts = make_prompts([30, 30, 30], 384, 10)
    reqs = [h.add(f"r{i}", p, max_new_tokens=25) for i, p in enumerate(prompts)]
    h.run()
    assert h.scheduler.num_retractions > 0
    assert [r.output_ids for r in reqs] == [hf_ref.greedy(tiny_llama_dir, p, 25) for p in prompts]


@pytest.mark.parametrize("page_size", [1, 4])
def test_engine_generate_matches_hf(tiny_llama_dir, hf_ref, make_prompts, page_size):
    prompts = make_prompts([5, 17, 30, 2], 384, 11)
    with Engine(
        str(tiny_llama_dir),
        dtype="float64",
        max_total_tokens=1024,
        page_size=page_size,
        chunked_prefill_size=16,
    ) as engine:
        engine.check_invariants = True
        outs = engine.generate(
            input_ids=prompts,
            sampling_params={"max_new_tokens": N, "temperature": 0, "ignore_eos": True},
        )
        again = engine.generate(
            input_ids=prompts[2] + [7, 8],
            sampling_params={"max_new_tokens": N, "temperature": 0, "ignore_eos": True},
        )
    assert [o["output_ids"] for o in outs] == [hf_ref.greedy(tiny_llama_dir, p, N) for p in prompts]
    assert again["output_ids"] == hf_ref.greedy(tiny_llama_dir, prompts[2] + [7, 8], N)
    assert again["meta_info"]["cached_tokens"] >= 30 - 30 % page_size - page_size


def test_seeded_sampling_is_reproducible(tiny_llama_dir):
    params = {"max_new_tokens": 12, "temperature": 1.0, "top_p": 0.9, "seed": 1234}
    with Engine(str(tiny_llama_dir), dtype="float32", max_total_tokens=1024) as engine:
        alone = engine.generate("The quick brown fox", params)["output_ids"]
        batch = engine.generate(
            ["Hello", "The quick brown fox", "Paris"],
            [
                {"max_new_tokens": 12, "temperature": 1.0},
                params,
                {"max_new_tokens": 5, "temperature": 0.7},
            ],
        )
        other = engine.generate("The quick brown fox", {**params, "seed": 99})["output_ids"]
    assert batch[1]["output_ids"] == alone
    assert other != alone


def test_prompt_logprobs_equal_hf(tiny_llama_dir, hf_ref, make_prompts):
    [p] = make_prompts([25], 384, 12)
    with Engine(
        str(tiny_llama_dir), dtype="float64", max_total_tokens=1024, chunked_prefill_size=8
    ) as engine:
        engine.generate(input_ids=p[:20], sampling_params={"max_new_tokens": 1})  # cache a prefix
        out = engine.generate(
            input_ids=p,
            sampling_params={"max_new_tokens": 2},
            return_logprob=True,
            logprob_start_len=3,
            top_logprobs_num=2,
        )
    want = hf_ref.prompt_logprobs(tiny_llama_dir, p)[2:]  # positions 3..24
    got = out["meta_info"]["input_token_logprobs"]
    assert [t for _, t, _ in got] == p[3:]
    assert [lp for lp, _, _ in got] == pytest.approx(want, abs=1e-5)
    assert len(out["meta_info"]["input_top_logprobs"]) == len(got)
    assert len(out["meta_info"]["output_token_logprobs"]) == 2


def test_shared_prefix_batch_uses_cascade_and_matches_hf(
    tiny_llama_dir, harness_factory, hf_ref, make_prompts
):
    """Several requests over one cached prefix long enough to be worth reading once: the
    torch backend does so (cascade attention) in extend and decode steps; ids still equal
    HF's."""
    h = harness_factory(tiny_llama_dir, max_total_tokens=4096)
    shared, *tails = make_prompts([440, 3, 9, 1, 5, 2, 7, 4, 6], 384, 13)
    assert (len(tails) - 1) * len(shared) >= attention.CASCADE_MIN_SAVED_POSITIONS
    h.add("warm", shared, max_new_tokens=1)
    h.run()
    reqs = [h.add(f"t{i}", shared + t, max_new_tokens=N) for i, t in enumerate(tails)]
    h.step()
    assert h.runner.attn.shared_len == 440  # the prefill of the eight tails
    h.step()
    assert h.runner.attn.shared_len == 440  # and their first decode
    h.run()
    assert [r.output_ids for r in reqs] == [
        hf_ref.greedy(tiny_llama_dir, shared + t, N) for t in tails
    ]


def test_a_row_handed_on_is_another_request_in_the_decode_copy(
    tiny_llama_dir, harness_factory, hf_ref, make_prompts
):
    """Prompts cached but for their last token start with a decode step, on the row the request
    before them freed. Two prompts that differ in one token, each asked again after the other:
    each gets its own continuation, not the one the row's former request left in the decode
    copy (attention.DecodeKV), alone or joining a running request."""
    h = harness_factory(tiny_llama_dir, max_total_tokens=4096)
    head, tail, other = make_prompts([20, 3, 15], 384, 13)
    a, b = head + [41] + tail, head + [42] + tail
    for rid, p in [("a", a), ("b", b), ("a2", a), ("b2", b)]:
        r = h.add(rid, p, max_new_tokens=N)
        h.run()
        assert r.output_ids == hf_ref.greedy(tiny_llama_dir, p, N), rid
    assert h.steps[-N] == {"b2": 1}  # cached but for its last token: a decode step
    long = h.add("long", other, max_new_tokens=3 * N)  # runs while the others come and go
    h.step()
    for rid, p in [("a3", a), ("b3", b), ("a4", a)]:
        r = h.add(rid, p, max_new_tokens=N)
        while r.finish is None:
            h.step()
        assert r.output_ids == hf_ref.greedy(tiny_llama_dir, p, N), rid
    h.run()
    assert long.output_ids == hf_ref.greedy(tiny_llama_dir, other, 3 * N)
