"""fork: isolated branches from one cached prefix, run concurrently, joined back two ways."""

from __future__ import annotations

import threading

import pytest
from stemma.lang import fork, function, gen


def _branch_reply(barrier: threading.Barrier):
    """A reply that only comes once all branches' requests are in flight together."""

    def reply(prompt: str, params: dict) -> str:
        barrier.wait()
        return "idea" + prompt[-1]

    return reply


def test_branches_share_the_prefix_and_never_leak(make_backend):
    backend = make_backend(rules={"Plan: ": "go"}, default=lambda p, _: "<" + p[-2:] + ">")

    @function
    def prog(s):
        s += "Plan: " + gen("plan") + "\n"
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f"Option {i}:" + gen("option")
            f["mine"] = i
        s += "parent continues"
        return forks

    state = prog.run(backend=backend)
    forks = state.ret_value
    texts = [f.text() for f in forks]
    assert texts == [f"Plan: go\nOption {i}:<{i}:>" for i in range(3)]
    assert [f["option"] for f in forks] == ["<0:>", "<1:>", "<2:>"]
    assert [f["plan"] for f in forks] == ["go"] * 3
    assert [f["mine"] for f in forks] == [0, 1, 2]
    assert state.text() == "Plan: go\nparent continues"
    with pytest.raises(KeyError):
        state["option"]


def test_fork_prefills_the_prefix_once_before_the_branches(backend):
    @function
    def prog(s):
        s += "Shared prefix. "
        forks = fork(s, 2)
        for f in forks:
            f += gen("x")
        forks.join()

    prog.run(backend=backend)
    warm, *branches = backend.requests
    assert warm == {"text": "Shared prefix. ", "sampling_params": {"max_new_tokens": 0}}
    assert [b["text"] for b in branches] == ["Shared prefix. "] * 2


def test_fork_of_one_sends_no_prefill(backend):
    @function
    def prog(s):
        s += "x"
        [only] = s.fork(1)
        only += gen("y")
        only.sync()

    prog.run(backend=backend)
    assert [r["sampling_params"].get("max_new_tokens") for r in backend.requests] == [128]


def test_branches_run_concurrently(make_backend):
    barrier = threading.Barrier(3, timeout=10)
    backend = make_backend(default=_branch_reply(barrier))

    @function
    def prog(s):
        s += "Q"
        forks = s.fork(3)
        forks += lambda i: str(i) + gen("a")
        forks.join()

    state = prog.run(backend=backend)
    assert state["a"] == ["idea0", "idea1", "idea2"]


def test_join_gather_variable_collects_new_variables_as_lists(backend):
    @function
    def prog(s):
        s += "x" + gen("before")
        forks = s.fork(2)
        forks += [gen("a"), "no gen"]
        forks.join("gather_variable")

    state = prog.run(backend=backend)
    assert state["a"] == ["ok", None]
    assert state["before"] == "ok"
    assert state.text() == "xok"


def test_join_concate_and_append_appends_branch_texts_in_order(make_backend):
    backend = make_backend(default=lambda p, _: p[-1] * 2)

    @function
    def prog(s):
        s += "Docs:"
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f" {'abc'[i]}" + gen("doc")
        forks.join(mode="concate_and_append")
        s += " | summary:" + gen("summary")

    state = prog.run(backend=backend)
    assert state.text() == "Docs: aaa bbb ccc | summary:::"
    assert backend.gen_requests()[-1]["text"] == "Docs: aaa bbb ccc | summary:"


def test_bad_join_mode_and_fork_size(backend):
    @function
    def prog(s, mode, n):
        s += "x"
        s.fork(n).join(mode)

    with pytest.raises(ValueError, match="join mode.*'zip'"):
        prog.run(mode="zip", n=2, backend=backend)
    with pytest.raises(ValueError, match="fork needs an int n >= 1, got 0"):
        prog.run(mode="gather_variable", n=0, backend=backend)


def test_a_failed_branch_fails_the_join(make_backend):
    backend = make_backend(rules={"1": RuntimeError("branch 1 exploded")})

    @function
    def prog(s):
        s += "x"
        forks = s.fork(2)
        forks += lambda i: str(i) + gen("a")
        forks.join("concate_and_append")

    state = prog.run(backend=backend)
    with pytest.raises(RuntimeError, match="branch 1 exploded"):
        state.text()


def test_forking_a_failed_state_raises_instead_of_hanging(make_backend):
    backend = make_backend(default=RuntimeError("prefill failed"))

    @function
    def prog(s):
        s += "x" + gen("y")
        s.fork(2)

    with pytest.raises(RuntimeError, match="prefill failed"):
        prog.run(backend=backend)


def test_branches_can_fork_again(make_backend):
    backend = make_backend(default=lambda p, _: p[-1])

    @function
    def prog(s):
        s += "r"
        outer = s.fork(2)
        outer += lambda i: str(i)
        inner = outer[1].fork(2)
        inner += lambda i: "abc"[i] + gen("leaf")
        return [f.text() for f in inner]

    assert prog.run(backend=backend).ret_value == ["r1aa", "r1bb"]


def test_sync_waits_for_branches_nobody_read(make_backend):
    """A program may stop reading its forks early (a search that takes the first good branch):
    the run's first state's sync() still returns only once every branch's request is done, so
    no request of the program outlives it (a cache flush right after cannot find one running)."""
    release = threading.Event()
    done: list[str] = []

    def slow(prompt: str, params: dict) -> str:
        if prompt.endswith("B:"):  # cannot finish before the test releases it, however slow
            assert release.wait(60), "never released"
        done.append(prompt[-2:])
        return "x"

    backend = make_backend(default=slow)

    @function
    def prog(s):
        s += "Q. "
        forks = s.fork(2)
        forks[0] += "A:" + gen("a")
        forks[1] += "B:" + gen("b")
        return forks[0]["a"]  # the second branch is never read

    state = prog.run(backend=backend)
    assert state.ret_value == "x" and "B:" not in done
    threading.Timer(0.2, release.set).start()
    state.sync()
    assert sorted(done) == ["A:", "B:"]
