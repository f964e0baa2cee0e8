"""The engine on the Triton attention backend (interpreter on CPU) gives the torch backend's
greedy tokens on a tiny float32 Llama: prefill, chunked prefill, a prefix hit, mixed steps."""

from __future__ import annotations


def run(harness_factory, ckpt, backend: str, prompts: list[list[int]]) -> list[list[int]]:
    h = harness_factory(
        ckpt,
        dtype="float32",
        attention_backend=backend,
        max_total_tokens=512,
        chunked_prefill_size=16,
        page_size=1,
    )
    first = h.add("warm", prompts[0], max_new_tokens=2)  # its prompt is then cached
    h.run()
    reqs = [first]
    for i, p in enumerate(prompts):
        reqs.append(h.add(f"r{i}", p, max_new_tokens=6))
        h.step()  # arrivals at different steps: later prefills mix with decodes
    h.run()
    assert h.scheduler.tree.num_hit_tokens > 0
    return [r.output_ids for r in reqs]


def test_triton_backend_matches_torch_greedy(tiny_llama_dir, harness_factory, make_prompts):
    prompts = make_prompts([20, 1, 37, 5], 384, 21)
    prompts[2] = prompts[0] + prompts[2][:10]  # shares a cached prefix with the first
    got = run(harness_factory, tiny_llama_dir, "triton", prompts)
    want = run(harness_factory, tiny_llama_dir, "torch", prompts)
    assert got == want
