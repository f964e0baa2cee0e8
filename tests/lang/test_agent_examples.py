"""The agent-suite examples run to completion against the scripted fake backend, and their
workloads give distinct programs."""

from __future__ import annotations

import pytest
from stemma.examples import (
    llm_judge,
    multi_turn_chat,
    multiple_choice,
    react_agent,
    skeleton_of_thought,
    tool_call_agent,
    tree_of_thought,
)

SUITE = [
    multiple_choice,
    react_agent,
    tree_of_thought,
    skeleton_of_thought,
    llm_judge,
    tool_call_agent,
    multi_turn_chat,
]
TURN_END = "<|im_end|>\n<|im_start|>assistant\n"


def _prefer(backend, choice: str) -> None:
    ids = tuple(backend.tokenize(choice))
    backend.logprobs[ids] = [-0.01] * len(ids)


@pytest.mark.parametrize("module", SUITE, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_workloads_are_distinct_programs(module):
    items = module.workload(40)
    assert len(items) == 40
    assert len({repr(sorted(item.items())) for item in items}) == 40


def test_multiple_choice_selects_a_letter_after_the_shared_shots(make_backend):
    backend = make_backend()
    _prefer(backend, "C")
    assert multiple_choice.run_example(backend, num=5) == ["C"] * 5
    warm = backend.requests[0]
    assert warm["sampling_params"] == {"max_new_tokens": 0}
    assert multiple_choice.FEW_SHOT in warm["text"]


def test_react_agent_feeds_observations_back(make_backend):
    backend = make_backend(rules={"Input for lookup:" + TURN_END: "Brindle"}, default="thinking")
    result = react_agent.run_example(backend)
    assert result["actions"] == ["lookup"] * 3
    final = backend.gen_requests()[-1]["text"]
    assert final.count(react_agent.TOWNS["brindle"]) == 3
    assert final.endswith("Give the final answer in one sentence." + TURN_END)


def test_react_agent_stops_at_finish(make_backend):
    backend = make_backend(default="thinking")
    _prefer(backend, "finish")
    assert react_agent.run_example(backend)["actions"] == ["finish"]
    assert len(backend.gen_requests()) == 2


def test_tree_of_thought_expands_nested_branches(make_backend):
    backend = make_backend(default=lambda prompt, params: f"thought {len(prompt)}")
    _prefer(backend, "no")
    result = tree_of_thought.run_example(backend)
    gens = backend.gen_requests()
    assert len(gens) == 2 + 4 + 1
    assert result["chosen"] == "leaf 0"  # nothing promising: the first leaf
    assert gens[-1]["text"].count("Use this reasoning: thought") == 1
    warms = [r for r in backend.requests if r.get("sampling_params") == {"max_new_tokens": 0}]
    assert sum("text" in r for r in warms) == 3  # the root fork and each first-level fork


def test_skeleton_of_thought_expands_each_point_in_a_branch(make_backend):
    outline = "1. Fewer cars\n2) Better buses\n- Safe bike lanes\n4. extra"
    backend = make_backend(rules={"a few words each." + TURN_END: outline}, default="More.")
    result = skeleton_of_thought.run_example(backend)
    assert result["points"] == ["Fewer cars", "Better buses", "Safe bike lanes"]
    assert result["expansions"] == ["More."] * 3
    # The branches run concurrently: their requests reach the backend in any order.
    expand = [r["text"] for r in backend.gen_requests()[1:]]
    expanded = [[p for p in result["points"] if f"'{p}'" in t] for t in expand]
    assert sorted(expanded) == sorted([p] for p in result["points"])


def test_outline_points_fill_missing_points():
    assert skeleton_of_thought.outline_points("Only one\n\n") == [
        "Only one",
        "aspect 2",
        "aspect 3",
    ]


def test_llm_judge_merges_the_verdicts(make_backend):
    backend = make_backend(default="B is clearer.")
    _prefer(backend, "B")
    assert llm_judge.run_example(backend) == {"verdicts": ["B", "B", "B"], "overall": "B"}
    scored = [r for r in backend.requests if r.get("return_logprob")]
    assert len(scored) == 4


def test_multi_turn_chat_keeps_the_whole_conversation(make_backend):
    backend = make_backend(default=lambda prompt, params: f"reply {prompt.count('<|im_start|>')}")
    messages = multi_turn_chat.run_example(backend)
    assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * 4
    assert [m["content"] for m in messages[2::2]] == ["reply 3", "reply 5", "reply 7", "reply 9"]
