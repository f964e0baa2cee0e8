"""The examples run to completion against the scripted fake backend."""

from __future__ import annotations

import json

from stemma.examples import branching_agent, few_shot_classify, tool_call_agent


def _ids(backend, text: str) -> tuple[int, ...]:
    return tuple(backend.tokenize(text))


def test_branching_agent_scores_branches_and_expands_the_best(make_backend):
    def reply(prompt: str, params: dict) -> str:
        if "approach number" in prompt[-80:]:
            return f"Approach {prompt[-40]}"
        return "three steps" if "three short steps" in prompt else "Swap books."

    backend = make_backend(default=reply)
    backend.logprobs = {_ids(backend, "4"): [-0.1]}
    result = branching_agent.run_example(backend)
    assert result["goal"] == "Swap books."
    assert result["scores"] == [4, 4, 4]
    assert result["best"] == 0
    assert result["steps"] == "three steps"
    assert result["approaches"][0] in backend.gen_requests()[-1]["text"]


def test_tool_call_agent_runs_the_tool_the_model_calls(make_backend):
    def reply(prompt: str, params: dict) -> str:
        if params.get("json_schema"):
            return '{"tool": "calculator", "argument": "12 * 7"}'
        return "12 times 7 is 84."

    backend = make_backend(default=reply)
    result = tool_call_agent.run_example(backend)
    assert result == {
        "call": {"tool": "calculator", "argument": "12 * 7"},
        "result": "84",
        "answer": "12 times 7 is 84.",
    }
    call_request, answer_request = backend.gen_requests()
    assert json.loads(call_request["sampling_params"]["json_schema"]) == tool_call_agent.CALL_SCHEMA
    assert "The tool returned: 84" in answer_request["text"]


def test_tool_errors_are_shown_to_the_model():
    assert tool_call_agent.run_tool("calculator", "1 / 0") == "error: division by zero"
    assert tool_call_agent.run_tool("calculator", "__import__('os')").startswith("error:")
    assert tool_call_agent.run_tool("capital", " Peru ") == "Lima"
    assert tool_call_agent.run_tool("search", "x") == "error: unknown tool 'search'"


def test_few_shot_classify_labels_every_review(make_backend):
    backend = make_backend()
    backend.logprobs = {_ids(backend, "negative"): [-0.1] * len(_ids(backend, "negative"))}
    results = few_shot_classify.run_example(backend, progress_bar=False)
    assert [label for _, _, label in results] == ["negative"] * len(few_shot_classify.REVIEWS)
    warm = backend.requests[0]
    assert warm["sampling_params"] == {"max_new_tokens": 0}
    assert warm["text"].endswith(few_shot_classify.FEW_SHOT + "Review: ")
