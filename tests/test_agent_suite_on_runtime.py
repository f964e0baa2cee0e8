"""Every agent-suite example runs to completion on the built-in model, in-process, with a few
tokens per gen."""

from __future__ import annotations

import json

import jsonschema
import pytest
import stemma
from stemma.examples import (
    llm_judge,
    multi_turn_chat,
    multiple_choice,
    react_agent,
    skeleton_of_thought,
    tool_call_agent,
    tree_of_thought,
)


@pytest.fixture(scope="module")
def runtime():
    with stemma.Runtime(model="smollm2-135m") as rt:
        yield rt


def test_multiple_choice_runs(runtime):
    assert set(multiple_choice.run_example(runtime, num=3)) <= set(multiple_choice.LETTERS)


def test_react_agent_runs(runtime):
    result = react_agent.run_example(runtime, max_tokens=4)
    actions = result["actions"]
    # The loop's contract: it stops at the first "finish", else after max_steps (3) actions.
    assert "finish" not in actions[:-1]
    assert actions[-1] == "finish" or len(actions) == 3
    assert set(result["actions"]) <= set(react_agent.ACTIONS)


def test_tree_of_thought_runs(runtime):
    assert tree_of_thought.run_example(runtime, max_tokens=4)["chosen"].startswith("leaf ")


def test_skeleton_of_thought_runs(runtime):
    result = skeleton_of_thought.run_example(runtime, max_tokens=4)
    assert len(result["points"]) == len(result["expansions"]) == skeleton_of_thought.NUM_POINTS


def test_llm_judge_runs(runtime):
    result = llm_judge.run_example(runtime, max_tokens=4)
    assert len(result["verdicts"]) == len(llm_judge.CRITERIA)
    assert result["overall"] in ("A", "B")


def test_tool_call_agent_runs_every_workload_shape(runtime):
    for item in tool_call_agent.workload(2):
        state = tool_call_agent.PROGRAM.run(**item, backend=runtime)
        jsonschema.validate(json.loads(state["call"]), tool_call_agent.CALL_SCHEMA)


def test_multi_turn_chat_runs(runtime):
    messages = multi_turn_chat.run_example(runtime, max_tokens=4)
    assert [m["role"] for m in messages][-2:] == ["user", "assistant"]
    assert len(messages) == 9
