"""DSL programs against the built-in model, in-process: the examples run to completion and a
fork's branches are served from the cached shared prefix."""

from __future__ import annotations

import re

import jsonschema
import pytest
import stemma
from stemma import assistant, function, gen, system, user
from stemma.examples import branching_agent, few_shot_classify, tool_call_agent


@pytest.fixture(scope="module")
def runtime():
    with stemma.Runtime(model="smollm2-135m") as rt:
        yield rt


def test_branching_agent_example_runs(runtime):
    result = branching_agent.run_example(runtime)
    assert len(result["approaches"]) == 3 and all(result["approaches"])
    assert all(1 <= s <= 5 for s in result["scores"])
    assert result["steps"].strip()


def test_few_shot_classify_example_runs(runtime):
    results = few_shot_classify.run_example(runtime, progress_bar=False)
    assert len(results) == len(few_shot_classify.REVIEWS)
    assert {label for _, _, label in results} <= set(few_shot_classify.LABELS)


def test_tool_call_agent_example_runs(runtime):
    result = tool_call_agent.run_example(runtime)
    jsonschema.validate(result["call"], tool_call_agent.CALL_SCHEMA)
    assert result["result"] and result["answer"].strip()


def test_dtype_and_regex_gens_parse(runtime):
    @function
    def typed(s):
        s += user("How many legs does a spider have? Reply with a number.")
        s += assistant(gen("legs", dtype=int, max_tokens=8))
        s += user("Is the sky blue? Reply true or false.")
        s += assistant(gen("sky", dtype=bool, max_tokens=8))
        s += user("Give pi to two decimals.")
        s += assistant(gen("pi", dtype=float, max_tokens=8))
        s += user("Give today's date as YYYY-MM-DD.")
        s += assistant(gen("date", regex=r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]", max_tokens=16))

    state = typed.run(backend=runtime)
    assert isinstance(state["legs"], int) and not isinstance(state["legs"], bool)
    assert isinstance(state["sky"], bool)
    assert isinstance(state["pi"], float)
    assert re.fullmatch(r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]", state["date"])


def test_fork_of_eight_branches_hits_the_shared_prefix(runtime):
    @function
    def fan(s):
        s += system("You are a concise assistant who answers in one short sentence.")
        s += user("Name a color that starts with the letter B, and say why.")
        branches = s.fork(8)
        for b in branches:
            b += assistant(gen("answer", max_tokens=8, temperature=0.7, top_p=0.9))
        return [b.get_meta_info("answer") for b in branches]

    state = fan.run(backend=runtime)
    metas = state.ret_value
    shared = len(runtime.tokenize(state.text()))
    assert len(metas) == 8
    for meta in metas:
        # The branch prompt is the shared text plus the assistant prefix; all but the last
        # prompt token of the shared text must come from the cache.
        assert meta["cached_tokens"] >= shared - 1
