"""SGLang's own frontend (the pinned `sglang` package, installed without its runtime) runs
programs against stemma's server: gen, select, fork/join, run_batch, streaming, roles and
regex, first as programs written here, then some of SGLang's own test programs unchanged
(those whose assertions do not depend on the model knowing the answer; opt-in, `-m slow`). SGLang's
test_parallel_encoding is left out: its client joins with a /concate_and_append_request call
that neither SGLang's current server nor stemma serves, and then waits forever."""

from __future__ import annotations

import json
import re

import pytest

sgl = pytest.importorskip("sglang", reason="install with: pip install --no-deps sglang==0.5.23")


@pytest.fixture(scope="module")
def endpoint(smol_server):
    backend = sgl.RuntimeEndpoint(smol_server.url)
    sgl.set_default_backend(backend)
    yield backend
    sgl.set_default_backend(None)


def test_gen_select_and_roles(endpoint):
    @sgl.function
    def chat(s, question):
        s += sgl.system("You are terse.")
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=8, stop="\n"))
        s += sgl.user("Is that right?")
        s += sgl.assistant(sgl.select("sure", choices=["yes", "no"]))

    state = chat.run(question="What is 2 + 2?", temperature=0)
    assert state["sure"] in ("yes", "no") and "\n" not in state["answer"]
    roles = [m["role"] for m in state.messages()]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    assert state.messages()[2]["content"] == state["answer"].strip()  # SGLang strips messages
    assert state.text().startswith("SYSTEM:You are terse.")  # the template SGLang's client picks


def test_fork_join_and_run_batch(endpoint):
    @sgl.function
    def tips(s, topic):
        s += f"Two tips for {topic}:\n"
        forks = s.fork(2)
        for i in range(2):
            forks[i] += f"Tip {i + 1}:"
            forks[i] += sgl.gen("tip", max_tokens=6, stop="\n")
        forks.join()

    states = tips.run_batch([{"topic": "cooking"}, {"topic": "running"}], temperature=0)
    for state in states:
        assert len(state["tip"]) == 2 and all(isinstance(t, str) for t in state["tip"])


def test_stream_and_regex(endpoint):
    @sgl.function
    def stream_qa(s):
        s += "Q: Name a color.\nA:" + sgl.gen("answer", max_tokens=8, stop="\n")

    state = stream_qa.run(stream=True, temperature=0)
    assert "".join(state.text_iter("answer")) == state["answer"]

    date = r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]"

    @sgl.function
    def dated(s):
        s += "Today's date (YYYY-MM-DD): " + sgl.gen("date", regex=date, max_tokens=12)

    assert re.fullmatch(date, dated.run(temperature=0)["date"])


# SGLang's own programs generate up to 128-256 tokens each on SmolLM2 (~2 minutes on a 2-core
# CPU): opt in with `pytest -m slow`. The programs above cover the same primitives quickly.
@pytest.mark.slow
def test_sglang_suite_programs_unchanged(endpoint):
    from sglang.test import test_programs as suite

    suite.test_select(check_answer=False)
    suite.test_regex()
    suite.test_decode_json_regex()
    suite.test_dtype_gen()
    suite.test_expert_answer(check_answer=False)


@pytest.mark.slow
def test_sglang_json_and_mt_bench_unchanged(endpoint):
    from sglang.test import test_programs as suite

    suite.test_decode_json()
    suite.test_mt_bench()
    json.dumps(endpoint.get_server_info())  # /server_info answers with JSON
