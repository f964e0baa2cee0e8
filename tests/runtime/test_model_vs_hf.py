"""The paged-KV forward pass against HF transformers, float64, exact greedy ids."""

from __future__ import annotations

import pytest
import torch
from stemma.runtime.config import EngineConfig
from stemma.runtime.executor.model_runner import ModelRunner
from stemma.runtime.models.loader import load_model
from stemma.runtime.weight_plan import WeightPlan

from ..fixtures import hf_greedy

NEW_TOKENS = 12


class GreedyDriver:
    """Drives ModelRunner by hand: explicit slots, chunks and prefixes."""

    def __init__(
        self, ckpt, page_size: int = 1, dtype: str = "float64", plan: WeightPlan | None = None
    ):
        cfg = EngineConfig(
            model=str(ckpt),
            dtype=dtype,
            max_total_tokens=4096,
            page_size=page_size,
            max_running_requests=16,
        )
        self.loaded = load_model(str(ckpt), getattr(torch, dtype))
        self.runner = ModelRunner(cfg, self.loaded, plan)  # None: the runner's default plan
        self.owned: dict[int, list[int]] = {}  # row -> slots allocated to it (whole pages)

    def slots_for(self, row: int, start: int, num: int) -> list[int]:
        owned = self.owned.setdefault(row, [])
        while len(owned) < start + num:
            owned.extend(self.runner.allocator.alloc(1))  # one whole page
        return owned[start : start + num]

    def prefill(self, rows, prefix_lens, chunks) -> list[int]:
        slots = [
            s for r, p, c in zip(rows, prefix_lens, chunks) for s in self.slots_for(r, p, len(c))
        ]
        fb = self.runner.build_batch(rows, prefix_lens, chunks, slots)
        return self.runner.forward(fb).argmax(-1).tolist()

    def generate(self, prompts: list[list[int]], n: int = NEW_TOKENS, chunk: int | None = None):
        rows = [self.runner.req_to_token_pool.alloc() for _ in prompts]
        done = [0] * len(prompts)
        step = chunk or max(len(p) for p in prompts)
        last = [0] * len(prompts)
        while any(d < len(p) for d, p in zip(done, prompts)):
            idx = [i for i, p in enumerate(prompts) if done[i] < len(p)]
            pieces = [prompts[i][done[i] : done[i] + step] for i in idx]
            nxt = self.prefill([rows[i] for i in idx], [done[i] for i in idx], pieces)
            for i, piece, t in zip(idx, pieces, nxt):
                done[i] += len(piece)
                last[i] = t
        outs = [[t] for t in last]
        for _ in range(n - 1):
            lens = [len(p) + len(o) - 1 for p, o in zip(prompts, outs)]
            nxt = self.prefill(rows, lens, [[o[-1]] for o in outs])
            for o, t in zip(outs, nxt):
                o.append(t)
        return outs, rows


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def ckpt(request, tiny_llama_dir, tiny_qwen2_dir):
    return tiny_llama_dir if request.param == "llama" else tiny_qwen2_dir


def test_single_request_matches_hf(ckpt, hf_ref, make_prompts):
    [prompt] = make_prompts([11], 384)
    outs, _ = GreedyDriver(ckpt).generate([prompt])
    assert outs[0] == hf_ref.greedy(ckpt, prompt, NEW_TOKENS)


def test_batch_of_eight_mixed_lengths_matches_hf(ckpt, hf_ref, make_prompts):
    prompts = make_prompts([1, 3, 7, 16, 17, 30, 64, 5], 384, seed=1)
    outs, _ = GreedyDriver(ckpt).generate(prompts)
    assert outs == [hf_ref.greedy(ckpt, p, NEW_TOKENS) for p in prompts]


def test_chunked_prefill_matches_hf(ckpt, hf_ref, make_prompts):
    prompts = make_prompts([37, 9], 384, seed=2)
    outs, _ = GreedyDriver(ckpt).generate(prompts, chunk=5)
    assert outs == [hf_ref.greedy(ckpt, p, NEW_TOKENS) for p in prompts]


def test_prefix_read_from_pool_matches_hf(ckpt, hf_ref, make_prompts):
    """A second request reuses the first one's prefix slots and computes only its tail."""
    [shared, tail] = make_prompts([20, 6], 384, seed=3)
    drv = GreedyDriver(ckpt)
    _, [row_a] = drv.generate([shared], n=1)
    row_b = drv.runner.req_to_token_pool.alloc()
    drv.owned[row_b] = drv.runner.req_to_token_pool.read(row_a, len(shared))
    drv.runner.req_to_token_pool.write(row_b, 0, drv.owned[row_b])
    prompt = shared + tail
    out = [drv.prefill([row_b], [len(shared)], [tail])[0]]
    for _ in range(NEW_TOKENS - 1):
        out.append(drv.prefill([row_b], [len(prompt) + len(out) - 1], [[out[-1]]])[0])
    assert out == hf_ref.greedy(ckpt, prompt, NEW_TOKENS)


def test_mixed_batch_extend_and_decode(ckpt, hf_ref, make_prompts):
    """One step holding a decode of request A and the prefill of request B."""
    [a, b] = make_prompts([9, 13], 384, seed=4)
    drv = GreedyDriver(ckpt)
    ra, rb = drv.runner.req_to_token_pool.alloc(), drv.runner.req_to_token_pool.alloc()
    first_a = drv.prefill([ra], [0], [a])[0]
    second_a, first_b = drv.prefill([ra, rb], [len(a), 0], [[first_a], b])
    assert [first_a, second_a] == hf_ref.greedy(ckpt, a, 2)
    assert first_b == hf_ref.greedy(ckpt, b, 1)[0]


def test_page_size_16_matches_hf(ckpt, hf_ref, make_prompts):
    prompts = make_prompts([5, 21], 384, seed=5)
    drv = GreedyDriver(ckpt, page_size=16)
    outs, _ = drv.generate(prompts)
    assert outs == [hf_ref.greedy(ckpt, p, NEW_TOKENS) for p in prompts]


CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Translate 'good morning' into Spanish.",
]
NEW_CHAT_TOKENS = 16


@pytest.fixture(scope="module")
def smollm2_fp32():
    """Our loader's model and HF's own GGUF loader (its own dequantization and q/k order).

    HF's loader parses the file's header twice (config, then weights) and builds gguf-py's name
    map anew for every submodule of the model (a few hundred times): most of the load. The
    reader is read-only and the map a pure function of (arch, blocks), so both are memoized
    here; nothing else of the load changes."""
    import functools

    import gguf
    from stemma.runtime.models.loader import BUILTIN_MODELS, resolve_checkpoint
    from transformers import AutoModelForCausalLM

    ckpt = resolve_checkpoint("smollm2-135m")
    import importlib.util
    from pathlib import Path

    package, filename = BUILTIN_MODELS["smollm2-135m"]
    gguf_dir = Path(importlib.util.find_spec(package).submodule_search_locations[0])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        mp.setattr(gguf, "GGUFReader", functools.cache(gguf.GGUFReader))
        hf = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=filename, dtype=torch.float32)
    return ckpt, hf.eval()


def test_smollm2_fp32_matches_hf_greedy(smollm2_fp32):
    ckpt, hf = smollm2_fp32
    drv = GreedyDriver("smollm2-135m", dtype="float32")
    tok = drv.loaded.tokenizer
    prompts = [
        tok.encode(tok.apply_chat_template([{"role": "user", "content": q}])) for q in CHAT_PROMPTS
    ]
    ours, _ = drv.generate(prompts, n=NEW_CHAT_TOKENS)
    for prompt, mine in zip(prompts, ours):
        theirs, logits = hf_greedy(hf, prompt, NEW_CHAT_TOKENS)
        agree = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), len(theirs))
        if agree < len(theirs):  # a divergence is allowed only at a near-tie of HF's top two
            top2 = logits[agree].topk(2).values
            assert float(top2[0] - top2[1]) < 1e-4, (tok.decode(mine), tok.decode(theirs))
        assert agree >= 1
    assert "Paris" in tok.decode(ours[0])
