"""Sampler: exact logit processing, filters that never leak, seeded reproducibility, logprobs."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from stemma.runtime.sampling.params import SamplingParams
from stemma.runtime.sampling.sampler import AllMaskedError, Sampler, SamplingState

V = 40
EOS = 2


def state(prompt_ids: list[int] | None = None, vocab_size: int = V, **params: Any) -> SamplingState:
    return SamplingState.create(SamplingParams(**params), prompt_ids or [], vocab_size)


def sampler(vocab_size: int = V, seed: int = 0) -> Sampler:
    return Sampler(vocab_size, frozenset({EOS}), seed=seed)


def random_logits(num_rows: int, vocab_size: int = V, seed: int = 0) -> torch.Tensor:
    return torch.randn(num_rows, vocab_size, generator=torch.Generator().manual_seed(seed)) * 3


def pack(allowed: torch.Tensor) -> torch.Tensor:
    """[B, V] bool -> [B, ceil(V / 32)] int32 packed bitmask."""
    num_rows, vocab_size = allowed.shape
    padded = torch.zeros(num_rows, (vocab_size + 31) // 32 * 32, dtype=torch.int64)
    padded[:, :vocab_size] = allowed.long()
    words = (padded.view(num_rows, -1, 32) << torch.arange(32)).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def test_state_allocates_only_what_params_need() -> None:
    plain = state([1, 5])
    assert (plain.generator, plain.output_counts, plain.seen_mask) == (None, None, None)
    full = state([1, 5], seed=3, repetition_penalty=1.2, presence_penalty=0.5)
    full.record(7)
    full.record(7)
    assert full.generator is not None
    assert full.num_output_tokens == 2
    assert full.output_counts is not None and full.output_counts.dtype == torch.int32
    assert full.output_counts.nonzero().flatten().tolist() == [7]
    assert int(full.output_counts[7]) == 2
    assert full.seen_mask is not None
    assert full.seen_mask.nonzero().flatten().tolist() == [1, 5, 7]
    with pytest.raises(ValueError, match="stop_token_ids"):
        state(stop_token_ids=[V])


def test_greedy_is_argmax_with_lowest_id_on_ties() -> None:
    logits = random_logits(6)
    logits[0, 3] = logits[0, 9] = logits[0].max() + 1.0
    out = sampler().sample(logits, [state(temperature=0.0) for _ in range(6)])
    assert out.next_ids == logits.argmax(-1).tolist()
    assert out.next_ids[0] == 3


def test_top_k_1_is_greedy_even_with_temperature() -> None:
    logits = random_logits(8)
    out = sampler().sample(logits, [state(temperature=1.5, top_k=1) for _ in range(8)])
    assert out.next_ids == logits.argmax(-1).tolist()


PROBS = torch.tensor([0.35, 0.25, 0.2, 0.12, 0.08])


@pytest.mark.parametrize(
    ("params", "allowed"),
    [
        ({"top_k": 3}, {0, 1, 2}),
        ({"top_p": 0.55}, {0, 1}),  # mass before id 2 is 0.60 >= 0.55
        ({"top_p": 0.65}, {0, 1, 2}),
        ({"min_p": 0.5}, {0, 1, 2}),  # p >= 0.175
        ({"top_k": 2, "top_p": 0.55}, {0}),  # top_p over the top-k renormalized: 0.35/0.6
        ({"top_k": 4, "min_p": 0.6}, {0, 1}),
        ({"top_k": 0, "top_p": 1.0, "min_p": 0.0}, {0, 1, 2, 3, 4}),
    ],
)
def test_filters_never_leave_the_allowed_set(params: dict[str, Any], allowed: set[int]) -> None:
    num_rows = 3000
    logits = PROBS.log().expand(num_rows, -1).contiguous()
    out = sampler(vocab_size=5).sample(logits, [state(vocab_size=5, **params)] * num_rows)
    assert set(out.next_ids) == allowed  # all of the set, nothing else


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_empirical_distribution_matches_softmax(temperature: float) -> None:
    vocab_size, num_rows = 6, 30000
    logits = torch.tensor([[1.0, 0.0, -0.5, 2.0, 0.3, -1.0]]).expand(num_rows, -1).contiguous()
    states = [state(vocab_size=vocab_size, temperature=temperature)] * num_rows
    out = sampler(vocab_size=vocab_size, seed=1234).sample(logits, states)
    counts = torch.bincount(torch.tensor(out.next_ids), minlength=vocab_size).double()
    expected = torch.softmax(logits[0].double() / temperature, -1) * num_rows
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    assert chi_square < 20.5  # chi-square, 5 degrees of freedom, p = 0.001


def test_same_seed_same_ids_regardless_of_batch_row_and_size() -> None:
    vocab_size = 1000
    base = random_logits(1, vocab_size, seed=7)

    def run(batch_size: int, row: int, steps: int = 6) -> list[int]:
        s = sampler(vocab_size)
        states = [state(vocab_size=vocab_size, seed=100 + i, top_p=0.9) for i in range(batch_size)]
        states[row] = state(vocab_size=vocab_size, seed=42, top_p=0.9)
        states += [state(vocab_size=vocab_size)]  # an unseeded row shares the batch
        ids: list[int] = []
        for _ in range(steps):
            logits = random_logits(batch_size + 1, vocab_size, seed=len(ids) + batch_size)
            logits[row] = base
            ids.append(s.sample(logits, states).next_ids[row])
            for st in states:
                st.record(0)
        return ids

    assert run(1, 0) == run(5, 3) == run(2, 1)


def test_different_seeds_give_different_ids() -> None:
    vocab_size = 1000
    logits = torch.zeros(8, vocab_size)
    states = [state(vocab_size=vocab_size, seed=s) for s in range(8)]
    first = sampler(vocab_size).sample(logits, states).next_ids
    assert len(set(first)) == 8


@pytest.mark.parametrize("penalty", [1.3, 0.7])
def test_repetition_penalty_matches_transformers(penalty: float) -> None:
    from transformers import RepetitionPenaltyLogitsProcessor

    logits = random_logits(2).double()
    prompts = [[1, 4, 4, 9], [0, 39]]
    states = [state(prompt, repetition_penalty=penalty) for prompt in prompts]
    states[0].record(12)
    states[1].record(4)
    history = [[1, 4, 4, 9, 12], [0, 39, 4]]
    hf = RepetitionPenaltyLogitsProcessor(penalty)
    expected = torch.cat(
        [hf(torch.tensor([h]), logits[i : i + 1].clone()) for i, h in enumerate(history)]
    )
    got = sampler().process_logits(logits, states)
    assert torch.equal(got, expected)


def test_frequency_and_presence_penalties_follow_openai_formula() -> None:
    logits = random_logits(3).double()
    states = [
        state([5, 5, 6], frequency_penalty=0.5, presence_penalty=1.5),
        state(frequency_penalty=-1.0),
        state(),
    ]
    for token_id in (3, 3, 3, 8):
        states[0].record(token_id)
        states[1].record(token_id)
    expected = logits.clone()
    expected[0, 3] -= 3 * 0.5 + 1.5  # prompt tokens 5 and 6 are not penalized
    expected[0, 8] -= 1 * 0.5 + 1.5
    expected[1, 3] += 3.0
    expected[1, 8] += 1.0
    assert torch.equal(sampler().process_logits(logits, states), expected)


def test_logit_bias_is_added_before_choosing() -> None:
    logits = torch.zeros(2, V, dtype=torch.float64)
    logits[:, 5] = 1.0
    states = [state(temperature=0.0, logit_bias={"7": 2.5, 5: -1.0}), state(temperature=0.0)]
    processed = sampler().process_logits(logits, states)
    expected = logits.clone()
    expected[0, 7] = 2.5
    expected[0, 5] = 0.0
    assert torch.equal(processed, expected)
    assert sampler().sample(logits, states).next_ids == [7, 5]


def test_bitmask_masks_constrained_rows_only() -> None:
    vocab_size, num_rows = 70, 4  # not a multiple of 32
    logits = random_logits(num_rows, vocab_size).double()
    allowed = torch.ones(num_rows, vocab_size, dtype=torch.bool)
    allowed[1] = False
    allowed[1, [0, 33, 69]] = True
    allowed[3] = torch.arange(vocab_size) % 2 == 1
    bitmask = pack(allowed)
    bitmask[[0, 2]] = -1  # unconstrained rows
    states = [state(vocab_size=vocab_size) for _ in range(num_rows)]
    processed = sampler(vocab_size).process_logits(logits, states, bitmask)
    assert torch.equal(processed[[0, 2]], logits[[0, 2]])
    expected = logits.masked_fill(~allowed, float("-inf"))
    assert torch.equal(processed, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_the_bitmask_sets_exactly_the_disallowed_logits_to_minus_inf(dtype) -> None:
    """Bit for bit what masked_fill_ gives, in each logits dtype, NaN, infinities and -0.0
    included: disallowed logits become -inf, allowed ones keep their bits."""
    vocab_size, num_rows = 101, 5
    logits = random_logits(num_rows, vocab_size).to(dtype)
    logits[:, :4] = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0], dtype=dtype)
    allowed = torch.rand(num_rows, vocab_size, generator=torch.Generator().manual_seed(5)) < 0.5
    allowed[:, :4] = torch.tensor([[True] * 4, [False] * 4] * 2 + [[True, False] * 2])
    processed = sampler(vocab_size).process_logits(
        logits, [state(vocab_size=vocab_size) for _ in range(num_rows)], pack(allowed)
    )
    as_int = {2: torch.int16, 4: torch.int32, 8: torch.int64}[logits.element_size()]
    expected = logits.masked_fill(~allowed, float("-inf"))
    assert torch.equal(processed.view(as_int), expected.view(as_int))


def test_sampled_and_greedy_rows_respect_the_bitmask() -> None:
    vocab_size, num_rows = 70, 600
    logits = random_logits(num_rows, vocab_size)
    allowed = torch.rand(num_rows, vocab_size, generator=torch.Generator().manual_seed(3)) < 0.1
    allowed[:, 17] = True
    states = [
        state(vocab_size=vocab_size, temperature=[0.0, 1.0, 2.0][i % 3]) for i in range(num_rows)
    ]
    out = sampler(vocab_size).sample(logits, states, pack(allowed))
    assert bool(allowed[torch.arange(num_rows), torch.tensor(out.next_ids)].all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("vocab_size", [70, 4096])  # row_max's plain and blockwise paths
def test_a_greedy_row_whose_max_the_mask_allows_is_not_masked(dtype, vocab_size, monkeypatch):
    """A greedy row with nothing but a mask takes its raw logits' first max where the mask
    allows it, without the mask written over its logits; every row still chooses what the
    whole mask gives: the first max of its masked logits (ties everywhere here), a row the
    mask empties and a NaN row fail, sampled and penalized rows are masked as before."""
    import stemma.runtime.sampling.sampler as sampler_module

    num_rows = 64
    g = torch.Generator().manual_seed(11)
    logits = torch.randint(-4, 5, (num_rows, vocab_size), generator=g).to(dtype)
    allowed = torch.rand(num_rows, vocab_size, generator=g) < 0.5
    first = logits.float().argmax(-1)  # the first max
    allowed[torch.arange(0, 40, 2), first[0:40:2]] = True  # taken unmasked
    allowed[torch.arange(1, 40, 2), first[1:40:2]] = False  # a later tie or a lower logit
    allowed[5] = False  # nothing allowed
    logits[6] = float("nan")
    states = [state(vocab_size=vocab_size, temperature=0.0) for _ in range(num_rows)]
    states[8] = state(vocab_size=vocab_size, temperature=1.0, seed=3)
    states[10] = state([1, 2], vocab_size=vocab_size, temperature=0.0, repetition_penalty=1.3)
    states[12] = state(vocab_size=vocab_size, temperature=0.0, logit_bias={3: 2.0})
    bitmask = pack(allowed)
    masked: list[int] = []
    real = sampler_module.apply_bitmask

    def spy(x: torch.Tensor, bits: torch.Tensor) -> None:
        masked.append(x.shape[0])
        real(x, bits)

    monkeypatch.setattr(sampler_module, "apply_bitmask", spy)
    with pytest.raises(AllMaskedError) as caught:
        sampler(vocab_size).sample(logits, states, bitmask, want_logprobs=False)
    out = caught.value.output
    assert caught.value.row_idxs == [5, 6]
    monkeypatch.setattr(sampler_module, "apply_bitmask", real)
    whole = sampler(vocab_size).process_logits(logits, states, bitmask)
    for i in range(num_rows):
        if i == 8:
            assert allowed[i, out.next_ids[i]]
        elif i not in (5, 6):
            assert out.next_ids[i] == int(whole[i].float().argmax()), i
    taken = [
        i
        for i in range(num_rows)
        if i not in (6, 8, 10, 12) and allowed[i, first[i]] and logits[i, first[i]] > -math.inf
    ]
    assert masked == [num_rows - len(taken)] and 20 <= len(taken) < num_rows


def test_constrained_greedy_rows_keep_the_models_bfloat16_logits() -> None:
    """A mask leaves a greedy row's choice an argmax (of the masked logits), exact in
    bfloat16: the output processor copies the logits to float32 only for rows that need more
    (logprobs, sampling, bias or penalties)."""
    from types import SimpleNamespace

    from stemma.runtime.scheduler.output_processor import OutputProcessor

    logits = random_logits(3).to(torch.bfloat16)
    plans = [SimpleNamespace(input_positions=[])] * 3

    def req(grammar: object, logprobs: bool = False, **params: Any) -> SimpleNamespace:
        logprob = SimpleNamespace(return_logprob=logprobs)
        return SimpleNamespace(grammar=grammar, logprob=logprob, sampling=state(**params))

    greedy = [req(object(), temperature=0.0), req(None, temperature=0.0)]
    assert OutputProcessor.widen([*greedy, greedy[0]], plans, logits) is logits
    for other in (
        req(object(), logprobs=True, temperature=0.0),
        req(object(), temperature=0.7),
        req(object(), temperature=0.0, logit_bias={1: 1.0}),
    ):
        widened = OutputProcessor.widen([*greedy, other], plans, logits)
        assert widened.dtype == torch.float32 and torch.equal(widened, logits.float())


def test_min_new_tokens_blocks_eos_and_stop_ids_until_reached() -> None:
    logits = torch.zeros(1, V)
    logits[0, EOS] = 50.0
    logits[0, 11] = 40.0
    logits[0, 20] = 30.0
    st = state(temperature=0.0, min_new_tokens=2, stop_token_ids=[11], ignore_eos=True)
    s = sampler()
    chosen = []
    for _ in range(3):
        chosen.append(s.sample(logits, [st]).next_ids[0])
        st.record(chosen[-1])
    assert chosen == [20, 20, EOS]


def test_logprobs_are_log_softmax_of_raw_logits() -> None:
    logits = random_logits(4).double()
    states = [
        state(temperature=0.0, logit_bias={3: 50.0}),
        state(temperature=0.3, repetition_penalty=1.5),
        state(top_k=3, frequency_penalty=1.0),
        state(seed=1, min_p=0.2),
    ]
    out = sampler().sample(logits, states)
    raw = torch.log_softmax(logits, -1)
    assert out.next_ids[0] == 3
    want = raw[torch.arange(4), torch.tensor(out.next_ids)].tolist()
    assert out.logprobs == pytest.approx(want, abs=1e-12)  # raw - logsumexp(raw), float64


def test_top_logprobs_per_row() -> None:
    logits = random_logits(3).double()
    out = sampler().sample(logits, [state() for _ in range(3)], top_logprobs_num=[2, 0, 5])
    raw = torch.log_softmax(logits, -1)
    assert out.top_logprobs is not None
    assert out.top_logprobs[1] == []
    for row, n in ((0, 2), (2, 5)):
        values, ids = raw[row].sort(descending=True)
        assert out.top_logprobs[row] == list(
            zip(values[:n].tolist(), ids[:n].tolist(), strict=True)
        )
    assert sampler().sample(logits, [state() for _ in range(3)]).top_logprobs is None


def test_float64_logits_keep_their_precision() -> None:
    logits = torch.zeros(1, V, dtype=torch.float64)
    logits[0, 1] = 1e-12  # lost in float32
    out = sampler().sample(logits, [state(temperature=0.0)])
    assert out.next_ids == [1]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_all_masked_or_nan_row_raises_and_names_it(temperature: float) -> None:
    logits = random_logits(3)
    allowed = torch.ones(3, V, dtype=torch.bool)
    allowed[1] = False
    logits[2, 5] = float("nan")
    states = [state(temperature=0.0)] + [state(temperature=temperature) for _ in range(2)]
    with pytest.raises(AllMaskedError, match=r"batch rows \[1, 2\]") as info:
        sampler().sample(logits, states, pack(allowed))
    assert info.value.row_idxs == [1, 2]
    assert info.value.output.next_ids[0] == int(logits[0].argmax())


def test_bad_shapes_are_rejected() -> None:
    s = sampler()
    with pytest.raises(ValueError, match="logits must be"):
        s.sample(torch.zeros(2, V + 1), [state(), state()])
    with pytest.raises(ValueError, match="sampling states"):
        s.sample(torch.zeros(2, V), [state()])
    with pytest.raises(ValueError, match="bitmask"):
        s.sample(torch.zeros(1, V), [state()], torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="top_logprobs_num"):
        s.sample(torch.zeros(1, V), [state()], top_logprobs_num=[-1])


def test_row_max_equals_max_with_first_index_on_ties_inf_and_nan() -> None:
    from stemma.runtime.sampling.sampler import row_max

    g = torch.Generator().manual_seed(0)
    for trial in range(60):
        x = torch.randn(int(torch.randint(1, 9, (1,), generator=g)), 49152, generator=g)
        if trial % 3 == 0:  # the same max in two blocks: the first wins
            x[:, 5000] = x[:, 40000] = 9.0
        if trial % 5 == 0:
            x[0] = float("-inf")
        if trial % 7 == 0:
            x[-1, 777] = float("nan")
        (best, ids), (ref_best, ref_ids) = row_max(x), x.max(dim=-1)
        assert torch.equal(ids, ref_ids)
        torch.testing.assert_close(best, ref_best, equal_nan=True, rtol=0, atol=0)
    odd = torch.randn(3, 1000)  # not a multiple of the block: plain max
    assert torch.equal(row_max(odd)[1], odd.argmax(-1))


def test_picks_plain_max_only_for_untouched_greedy_rows() -> None:
    from stemma.runtime.sampling.sampler import picks_plain_max

    assert picks_plain_max([state(temperature=0), state(temperature=0, ignore_eos=True)])
    for params in (
        {"temperature": 0.7},
        {"temperature": 0, "logit_bias": {"3": 1.0}},
        {"temperature": 0, "min_new_tokens": 2},
        {"temperature": 0, "repetition_penalty": 1.1},
        {"temperature": 0, "presence_penalty": 0.5},
    ):
        assert not picks_plain_max([state(temperature=0), state(**params)]), params
