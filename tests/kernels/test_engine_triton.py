"""The engine on the Triton attention backend (interpreter on CPU, compiled on CUDA) gives the
torch backend's greedy tokens on a tiny float32 Llama: prefill, chunked prefill, a prefix hit,
mixed steps."""

from __future__ import annotations


def run(harness_factory, ckpt, backend, device, prompts: list[list[int]]) -> list[list[int]]:
    h = harness_factory(
        ckpt,
        dtype="float32",
        device=str(device),
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


def test_triton_backend_matches_torch_greedy(tiny_llama_dir, harness_factory, make_prompts, device):
    prompts = make_prompts([20, 1, 37, 5], 384, 21)
    prompts[2] = prompts[0] + prompts[2][:10]  # shares a cached prefix with the first
    got = run(harness_factory, tiny_llama_dir, "triton", device, prompts)
    want = run(harness_factory, tiny_llama_dir, "torch", device, prompts)
    assert got == want


def test_engine_constrained_on_the_triton_backend(tiny_llama_dir, device):
    """The whole Engine (its thread, sampler and grammar masks; on CUDA the Triton bitmask
    kernel) on the Triton backend: regex and JSON-schema outputs of a random-weight model still
    match their constraint, under both grammar backends, greedy and sampled."""
    import json
    import re

    import jsonschema
    from stemma.runtime.engine import Engine

    schema = {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "tag": {"enum": ["a", "bc"]}},
        "required": ["id", "tag"],
        "additionalProperties": False,
    }
    regex = r"(yes|no)-[0-9]{2,4}"
    for backend in ("outlines", "llguidance"):
        engine = Engine(
            str(tiny_llama_dir),
            device=str(device),
            dtype="float32",
            attention_backend="triton",
            grammar_backend=backend,
            max_total_tokens=1024,
        )
        try:
            params = [
                {"regex": regex, "max_new_tokens": 16, "temperature": 0},
                {"regex": regex, "max_new_tokens": 16, "temperature": 1.0, "seed": 3},
                {"json_schema": json.dumps(schema), "max_new_tokens": 48, "temperature": 0},
                {"json_schema": json.dumps(schema), "max_new_tokens": 48, "temperature": 1.0},
                {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
            ]
            outs = engine.generate(["The quick brown fox"] * len(params), params)
        finally:
            engine.shutdown()
        for out in outs[:2]:
            assert re.fullmatch(regex, out["text"]), (backend, out)
        for out in outs[2:4]:
            if out["meta_info"]["finish_reason"]["type"] == "stop":
                jsonschema.validate(json.loads(out["text"]), schema)
            else:  # a random model may write digits until the budget: a prefix, never wrong
                assert re.match(r'\{\s*"id"\s*:\s*-?[0-9]', out["text"]), (backend, out)
        assert outs[4]["meta_info"]["completion_tokens"] == 8
