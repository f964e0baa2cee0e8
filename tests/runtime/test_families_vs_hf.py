"""Every supported family against HF transformers in float64: greedy ids equal and logits
within 1e-6 for a single request, a batch, chunked prefill and a radix-tree prefix hit.

Prompts are longer than the sliding windows (8 or 12 positions) and their decode steps cross
the original context of dynamic RoPE (32 positions), so the window mask, soft-capping and the
per-position RoPE rows are all on the compared path. Phi-3's longrope stays inside its original
48 positions: past them HF recomputes the whole sequence with the long factors, which stemma's
per-position tables do not (see models/rope.py).
"""

from __future__ import annotations

import pytest
import torch

from .families import FAMILIES, build_family, hf_attention
from .test_model_vs_hf import GreedyDriver

N = 8
LENGTHS = [27, 5, 20, 13]  # every prompt fits in the scalings' original 32 positions


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory, hf_ref):
    """(checkpoint, hf): hf(prompt) is HF's greedy (ids, logits [N, vocab]) in float64."""
    ckpt = build_family(tmp_path_factory.mktemp(request.param), request.param)
    attn = hf_attention(FAMILIES[request.param][1])
    return ckpt, lambda prompt: hf_ref.greedy_logits(ckpt, prompt, N, attn_implementation=attn)


def test_single_request_ids_and_logits(family, make_prompts):
    ckpt, hf = family
    [prompt] = make_prompts([LENGTHS[0]], 384, seed=21)
    drv = GreedyDriver(ckpt)
    row = drv.runner.req_to_token_pool.alloc()
    ids, logits = [], []
    chunk = prompt
    for _ in range(N):
        prefix = len(prompt) + len(ids) - len(chunk)
        slots = drv.slots_for(row, prefix, len(chunk))
        fb = drv.runner.build_batch([row], [prefix], [chunk], slots)
        step = drv.runner.forward(fb)[0]
        logits.append(step)
        ids.append(int(step.argmax()))
        chunk = [ids[-1]]
    want_ids, want_logits = hf(prompt)
    assert ids == want_ids
    assert (torch.stack(logits) - want_logits).abs().max().item() < 1e-6


def test_batch_matches_hf(family, make_prompts):
    ckpt, hf = family
    prompts = make_prompts(LENGTHS, 384, seed=22)
    outs, _ = GreedyDriver(ckpt).generate(prompts, n=N)
    assert outs == [hf(p)[0] for p in prompts]


def test_chunked_prefill_matches_hf(family, make_prompts):
    ckpt, hf = family
    prompts = make_prompts(LENGTHS[:2], 384, seed=23)
    outs, _ = GreedyDriver(ckpt).generate(prompts, n=N, chunk=5)
    assert outs == [hf(p)[0] for p in prompts]


def test_prefix_hit_longer_than_the_window(family, harness_factory, make_prompts):
    """The radix tree serves a 24-token prefix (three windows of 8) and only the tail is
    computed; the window mask, not the tree, keeps old keys out of sliding layers."""
    ckpt, hf = family
    shared, tail = make_prompts([24, 5], 384, seed=24)
    h = harness_factory(ckpt, max_total_tokens=1024, chunked_prefill_size=16)
    h.add("a", shared, max_new_tokens=2)
    h.run()
    b = h.add("b", shared + tail, max_new_tokens=N)
    h.run()
    assert b.cached_tokens == 24
    assert h.steps[-N] == {"b": 5}
    assert b.output_ids == hf(shared + tail)[0]
