"""One request's own outputs (its stop regexes, logprobs, draft, anything its output handling
raises) fail or finish that request alone; the requests beside it in the step go on."""

from __future__ import annotations

import pytest
from stemma.runtime.scheduler.output_processor import OutputProcessor

PROMPTS = [[5, 17, 42, 9], [7, 7, 30, 11, 3]]


def _alone(harness_factory, ckpt, ids: list[int], n: int) -> list[int]:
    h = harness_factory(ckpt)
    req = h.add("alone", ids, max_new_tokens=n)
    h.run()
    return req.output_ids


def test_stop_regex_without_stop_strings_finishes_its_request(harness_factory, tiny_llama_dir):
    """A stop_regex with no `stop` list once raised max() of an empty sequence and failed
    every request of the step."""
    h = harness_factory(tiny_llama_dir)
    stopped = h.add("regex", PROMPTS[0], max_new_tokens=8, stop_regex=r"[\s\S]")
    beside = h.add("beside", PROMPTS[1], max_new_tokens=8)
    h.run()
    assert stopped.finish.kind == "stop"
    assert isinstance(stopped.finish.matched, str) and len(stopped.finish.matched) == 1
    text = h.tokenizer.decode(stopped.output_ids)
    assert text.endswith(stopped.finish.matched) and len(text.strip() or text) >= 1
    assert beside.finish.kind == "length"
    assert beside.output_ids == _alone(harness_factory, tiny_llama_dir, PROMPTS[1], 8)


def test_a_request_whose_output_handling_raises_fails_alone(
    harness_factory, tiny_llama_dir, monkeypatch: pytest.MonkeyPatch
):
    real = OutputProcessor.check_finish

    def check_finish(self, req):
        if req.rid == "bad" and len(req.output_ids) == 2:
            raise RuntimeError("broken on its second token")
        return real(self, req)

    monkeypatch.setattr(OutputProcessor, "check_finish", check_finish)
    h = harness_factory(tiny_llama_dir)
    bad = h.add("bad", PROMPTS[0], max_new_tokens=8)
    good = h.add("good", PROMPTS[1], max_new_tokens=8)
    h.run()  # the harness checks the memory invariant after every step
    assert bad.finish.kind == "abort"
    assert "RuntimeError: broken on its second token" in bad.finish.message
    assert len(bad.output_ids) == 2
    assert good.finish.kind == "length"
    monkeypatch.setattr(OutputProcessor, "check_finish", real)
    assert good.output_ids == _alone(harness_factory, tiny_llama_dir, PROMPTS[1], 8)


def test_top_logprobs_beyond_the_vocabulary_are_the_whole_vocabulary(
    harness_factory, tiny_llama_dir
):
    """top_logprobs_num above the vocabulary size once raised in topk, on the prompt path
    and on the output path, failing the whole step."""
    h = harness_factory(tiny_llama_dir)
    many = {"return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 1_000_000}
    asked = h.add("many", PROMPTS[0], max_new_tokens=3, logprob=many)
    beside = h.add("beside", PROMPTS[1], max_new_tokens=3)
    h.run()
    assert asked.finish.kind == beside.finish.kind == "length"
    assert asked.input_top_logprobs[0] is None
    assert all(len(top) == h.vocab_size for top in asked.input_top_logprobs[1:])
    assert len(asked.input_top_logprobs) == len(PROMPTS[0])
    assert [len(top) for top in asked.output_top_logprobs] == [h.vocab_size] * 3
    assert beside.output_ids == _alone(harness_factory, tiny_llama_dir, PROMPTS[1], 3)


FORCED = "Forced: the quick brown fox jumps over the lazy dog, again and again and again."


@pytest.mark.parametrize("jump_forward", [True, False])
def test_a_draft_stops_short_of_the_context(jump_forward: bool):
    """A constrained request near the context limit: its jump-forward draft once ran past the
    context and failed the whole step. Now the draft stops where decoding without it stops,
    and the output is the same either way."""
    from stemma.runtime.engine import Engine

    with Engine(
        "smollm2-135m", kv_cache_mb=32, context_length=48, enable_jump_forward=jump_forward
    ) as engine:
        prompt = " ".join(["word"] * 40)
        num_prompt = len(engine.tokenizer.encode(prompt))
        near, beside = engine.generate(
            [prompt, "Hi"],
            [
                {"regex": FORCED, "max_new_tokens": 64, "temperature": 0},
                {"max_new_tokens": 4, "temperature": 0},
            ],
        )
    assert 30 < num_prompt < 47
    assert near["meta_info"]["finish_reason"] == {
        "type": "length",
        "length": 48 - num_prompt,
    }
    assert FORCED.startswith(near["text"]) and near["text"]
    assert beside["meta_info"]["finish_reason"]["type"] in ("stop", "length")


def test_a_response_that_cannot_be_built_fails_its_request_not_the_engine(
    tiny_llama_dir, monkeypatch: pytest.MonkeyPatch
):
    """The engine thread builds every response; one that raised there once ended the thread,
    and every request after it waited forever."""
    from stemma.runtime.engine import Engine
    from stemma.runtime.response import ResponseBuilder

    real = ResponseBuilder.build

    def build(self, req, text):
        if req.rid == "bad":
            raise UnicodeError("cannot decode this one")
        return real(self, req, text)

    monkeypatch.setattr(ResponseBuilder, "build", build)
    with Engine(str(tiny_llama_dir), dtype="float32", max_total_tokens=256) as engine:
        bad, good = engine.generate(
            input_ids=PROMPTS,
            sampling_params={"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
            rid=["bad", "good"],
        )
        after = engine.generate(input_ids=PROMPTS[1], sampling_params={"max_new_tokens": 2})
        assert engine.memory_state()["invariant_ok"]
    assert bad["meta_info"]["finish_reason"]["type"] == "abort"
    assert "cannot decode this one" in bad["meta_info"]["finish_reason"]["message"]
    assert good["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert after["meta_info"]["completion_tokens"] >= 1


def test_a_constraint_whose_mask_raises_fails_its_request_alone(
    tiny_llama_dir, monkeypatch: pytest.MonkeyPatch
):
    """A matcher that raised while its mask was computed (early closing's search once failed
    to roll back llguidance) failed the whole step: every request in it was aborted."""
    from stemma.runtime.constrained.matcher import Matcher
    from stemma.runtime.engine import Engine

    real = Matcher.fill_mask

    def fill_mask(self, bitmask, row=None):
        if self.grammar.regex.startswith("(x|y)") and self.num_accepted == 2:
            raise ValueError("cannot roll back 1 tokens")
        return real(self, bitmask, row)

    monkeypatch.setattr(Matcher, "fill_mask", fill_mask)
    params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    with Engine(str(tiny_llama_dir), dtype="float32", max_total_tokens=256) as engine:
        bad, good, plain = engine.generate(
            input_ids=[*PROMPTS, PROMPTS[0]],
            sampling_params=[{**params, "regex": "(x|y)+"}, {**params, "regex": "(a|b)+"}, params],
        )
        assert engine.memory_state()["invariant_ok"]
    reason = bad["meta_info"]["finish_reason"]
    assert reason == {"type": "abort", "message": "ValueError: cannot roll back 1 tokens"}
    assert bad["meta_info"]["completion_tokens"] == 2 and set(bad["text"]) <= {"x", "y"}
    assert good["meta_info"]["finish_reason"]["type"] in ("stop", "length")
    assert good["meta_info"]["completion_tokens"] >= 1 and set(good["text"]) <= {"a", "b"}
    assert plain["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
