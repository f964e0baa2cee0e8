"""SGLang's frontend API as stemma accepts it: the spellings SGLang programs use, on the
scripted backend (fork item assignment, copy, `in`, gen(choices), select temperature,
run_batch forms, bind / cache, dtype names)."""

from __future__ import annotations

import pytest
from stemma.lang import function, gen, gen_string, select


def test_fork_branches_take_item_assignment(make_backend):
    backend = make_backend(rules={"Tip 1:": "one", "Tip 2:": "two"})

    @function
    def tips(s):
        s += "Tips.\n"
        forks = s.fork(2)
        for i in range(2):
            forks[i] += f"Tip {i + 1}:"
            forks[i] += gen("tip", max_tokens=4)
        forks.join()
        return [forks[i]["tip"] for i in range(2)]

    state = tips.run(backend=backend)
    assert state.ret_value == ["one", "two"]
    assert state["tip"] == ["one", "two"]


def test_a_fork_branch_cannot_be_replaced(make_backend):
    @function
    def prog(s):
        forks = s.fork(2)
        forks[0] = forks[1]

    with pytest.raises(TypeError, match="cannot be replaced"):
        prog.run(backend=make_backend())


def test_copy_is_a_joined_one_branch_fork(make_backend):
    backend = make_backend(rules={"Q:": "A"})

    @function
    def prog(s):
        s += "Q:"
        with s.copy() as c:
            c += gen("draft", max_tokens=2)
        s += gen("final", max_tokens=2)

    state = prog.run(backend=backend)
    assert state["draft"] == ["A"]
    assert state.text() == "Q:A"


def test_in_tells_whether_a_variable_is_set(make_backend):
    @function
    def prog(s):
        s += "x:" + gen("x", max_tokens=2)

    state = prog.run(backend=make_backend())
    assert "x" in state and "y" not in state and 3 not in state


def test_fork_accepts_position_ids_offset(make_backend):
    @function
    def prog(s):
        s += "p"
        forks = s.fork(2, position_ids_offset=[0, 4])
        forks += gen("g", max_tokens=1)
        forks.join()

    assert prog.run(backend=make_backend())["g"] == ["ok", "ok"]

    @function
    def bad(s):
        s.fork(3, position_ids_offset=[0, 1])

    with pytest.raises(ValueError, match="2 entries for 3 branches"):
        bad.run(backend=make_backend())


def test_select_temperature_samples_by_the_scores(make_backend, monkeypatch):
    import stemma.lang.scoring as scoring

    seen = []

    def fake_choices(population, weights):
        seen.append((list(population), list(weights)))
        return [population[-1]]

    monkeypatch.setattr(scoring.random, "choices", fake_choices)

    @function
    def prog(s):
        s += "pick:" + select("x", ["a", "b"], temperature=0.5)

    state = prog.run(backend=make_backend())
    assert state["x"] == "b" and seen[0][0] == ["a", "b"]
    with pytest.raises(ValueError, match="temperature"):
        select("x", ["a"], temperature=-1)


def test_run_batch_takes_positional_lists_and_generator_style(make_backend):
    backend = make_backend(rules={"1": "one", "2": "two", "3": "three"})

    @function
    def prog(s, prefix, number="1"):
        s += prefix + number + gen("word", max_tokens=2)

    states = prog.run_batch([["n=", "2"], ("n=",), ["n=", "3"]], backend=backend)
    assert [s["word"] for s in states] == ["two", "one", "three"]
    stream = prog.run_batch([["n=", "3"], ["n=", "2"]], backend=backend, generator_style=True)
    assert not isinstance(stream, list)
    assert [s["word"] for s in stream] == ["three", "two"]
    with pytest.raises(TypeError, match="positional arguments"):
        prog.run_batch([["a", "b", "c"]], backend=backend)


def test_bind_fixes_arguments_and_cache_prefills_the_prefix(make_backend):
    backend = make_backend(rules={"Italy?\nA:": " Rome"})

    @function
    def qa(s, intro, question):
        s += intro + "Q: " + question + "\nA:" + gen("answer", max_tokens=4)

    bound = qa.bind(intro="Capitals.\n")
    assert bound.cache(backend=backend) == "Capitals.\nQ: "
    assert backend.requests[-1] == {
        "text": "Capitals.\nQ: ",
        "sampling_params": {"max_new_tokens": 0},
    }
    assert bound.run(question="Italy?", backend=backend)["answer"] == " Rome"
    with pytest.raises(TypeError, match="no parameter"):
        qa.bind(nope=1)


def test_gen_string_keeps_the_quoted_text_and_dtype_names_work(make_backend):
    backend = make_backend(rules={"name:": '"Paris"', "n:": "7"})

    @function
    def prog(s):
        s += "name:" + gen_string("name") + " n:" + gen("n", dtype="int")

    state = prog.run(backend=backend)
    assert state["name"] == '"Paris"' and state["n"] == 7
    assert state.text() == 'name:"Paris" n:7'


def test_function_takes_sglang_decorator_arguments(make_backend):
    @function(num_api_spec_tokens=64)
    def prog(s):
        s += "x" + gen("y", max_tokens=1)

    assert prog.num_api_spec_tokens == 64
    assert prog.run(backend=make_backend(), use_thread=False)["y"] == "ok"
