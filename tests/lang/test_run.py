"""Execution: run_batch, tracing, errors, streaming, async programs and the default backend."""

from __future__ import annotations

import asyncio
import threading

import pytest
from stemma.lang import (
    BackendError,
    assistant,
    function,
    gen,
    get_default_backend,
    select,
    set_default_backend,
    system,
    user,
)


@function
def echo(s, word):
    s += "Say " + word + ":" + gen("out")


def test_run_batch_keeps_input_order_and_finishes_every_item(make_backend):
    backend = make_backend(default=lambda p, _: p.split()[-1].upper())
    words = [f"w{i}" for i in range(20)]
    states = echo.run_batch([{"word": w} for w in words], backend=backend, num_threads=8)
    assert [s["out"] for s in states] == [f"{w.upper()}:" for w in words]
    assert all(s.error() is None for s in states)


def test_run_batch_stores_each_items_error_with_its_message(make_backend):
    backend = make_backend(
        rules={"Say b:": BackendError("HTTP 400 from /generate: bad regex '('", 400)}
    )
    states = echo.run_batch([{"word": w} for w in "abc"], backend=backend)
    assert [s.error() is None for s in states] == [True, False, True]
    assert states[1].error().status == 400
    with pytest.raises(BackendError, match=r"bad regex '\('"):
        states[1]["out"]
    assert states[2]["out"] == "ok"


def test_run_batch_reports_a_body_error_per_item(backend):
    @function
    def picky(s, x):
        if x == 2:
            raise ValueError("two is not allowed")
        s += str(x)

    states = picky.run_batch([{"x": i} for i in range(4)], backend=backend, num_threads=1)
    assert [type(s.error()) for s in states] == [type(None), type(None), ValueError, type(None)]
    with pytest.raises(ValueError, match="two is not allowed"):
        states[2].text()


def test_run_batch_warms_the_traced_prefix_once(backend):
    @function
    def classify(s, text):
        s += system("Label reviews.")
        with s.user():
            s += "Examples: good -> pos.\n"
            s += "Review: " + text
        s += assistant(select("label", choices=["pos", "neg"]))

    states = classify.run_batch([{"text": "fine"}, {"text": "bad"}], backend=backend)
    prefix = classify.trace(backend=backend)
    assert prefix == (
        "<|im_start|>system\nLabel reviews.<|im_end|>\n"
        "<|im_start|>user\nExamples: good -> pos.\nReview: "
    )
    assert backend.requests[0] == {"text": prefix, "sampling_params": {"max_new_tokens": 0}}
    assert [s["label"] for s in states] == ["pos", "pos"]


def test_trace_stops_at_gens_arguments_and_roles_without_backend():
    @function
    def prog(s, name, greeting="Hello"):
        s += greeting + ", "
        s += f"dear {name}"
        s += gen("x")

    @function
    def chat(s):
        s += "before "
        s += user("hi")

    assert prog.trace() == "Hello, "
    assert prog.trace(name="Ada") == "Hello, dear Ada"
    assert chat.trace() == "before "


def test_trace_of_an_async_program_and_a_nested_call():
    @function
    def header(s):
        s += "HEADER\n"

    @function
    async def prog(s, q):
        s += header()
        s += "Q: " + q
        s += gen("a")

    assert prog.trace() == "HEADER\nQ: "


def test_a_failed_request_raises_on_read_and_never_hangs(make_backend):
    backend = make_backend(rules={"a": RuntimeError("engine fell over")})

    @function
    def prog(s):
        s += "a" + gen("first")
        s += "b" + gen("second")

    state = prog.run(backend=backend)
    with pytest.raises(RuntimeError, match="engine fell over"):
        state["second"]
    with pytest.raises(RuntimeError, match="engine fell over"):
        state.text()
    assert len(backend.gen_requests()) == 1


def test_an_aborted_response_is_an_error(make_backend):
    def abort(prompt, params):
        raise BackendError("generate aborted: regex '(' does not compile")

    backend = make_backend(default=abort)

    @function
    def prog(s):
        s += "x" + gen("y", regex="(")
        return s["y"]

    with pytest.raises(BackendError, match="does not compile"):
        prog.run(backend=backend)


def test_abort_finish_reason_raises_with_its_message(make_backend):
    backend = make_backend()
    backend.generate = lambda req: {
        "text": "",
        "meta_info": {"finish_reason": {"type": "abort", "message": "out of memory"}},
    }

    @function
    def prog(s):
        s += "x" + gen("y")

    with pytest.raises(BackendError, match="out of memory"):
        prog.run(backend=backend)["y"]


@function
def streamed(s):
    s += "A:" + gen("a")


def _consume(chunks, gate: threading.Semaphore) -> list[str]:
    """Take chunks one at a time, letting the fake stream send the next only after each."""
    taken = []
    for chunk in chunks:
        taken.append(chunk)
        gate.release()
    return taken


def test_streaming_yields_chunks_in_order(make_backend):
    gate = threading.Semaphore(0)
    backend = make_backend(default=" one two three", chunk_size=4, stream_gate=gate)
    chunks = _consume(streamed.run(backend=backend, stream=True).text_iter(), gate)
    assert chunks == ["A:", " one", " two", " thr", "ee"]
    assert backend.stream_requests[0]["stream"] is True


def test_streaming_one_variable(make_backend):
    gate = threading.Semaphore(1)
    backend = make_backend(default=" one two three", chunk_size=4, stream_gate=gate)
    state = streamed.run(backend=backend, stream=True)
    assert _consume(state.text_iter("a"), gate) == [" one", " two", " thr", "ee"]
    assert state["a"] == " one two three"
    assert state.text() == "A: one two three"


def test_async_iteration_over_a_stream(make_backend):
    gate = threading.Semaphore(1)
    backend = make_backend(default="abcdef", chunk_size=2, stream_gate=gate)

    async def collect():
        taken = []
        async for chunk in streamed.run(backend=backend, stream=True).text_async_iter("a"):
            taken.append(chunk)
            gate.release()
        return taken

    assert asyncio.run(collect()) == ["ab", "cd", "ef"]


def test_a_stream_that_fails_raises_from_the_iterator(make_backend):
    backend = make_backend(default=RuntimeError("stream broke"))
    with pytest.raises(RuntimeError, match="stream broke"):
        list(streamed.run(backend=backend, stream=True).text_iter())


def test_async_def_programs_await_state_operations(make_backend):
    backend = make_backend(rules={"Q1:": "A1", "Q2:": "A2", "Q1:A1\nAB": "!"})

    @function
    async def ask(s, q):
        s += q + ":" + gen("a")
        answer = await s.aget("a")
        s += f"\n{answer[0]}B" + gen("b")
        forks = await s.afork(2)
        forks += gen("c")
        await forks.ajoin()
        return await s.atext()

    async def main():
        return await asyncio.gather(
            ask.run_async(q="Q1", backend=backend), ask.run_async(q="Q2", backend=backend)
        )

    first, second = asyncio.run(main())
    assert first.ret_value == "Q1:A1\nAB!"
    assert second.ret_value == "Q2:A2\nABok"
    assert first["c"] == ["ok", "ok"]
    assert [s["b"] for s in ask.run_batch([{"q": "Q1"}, {"q": "Q2"}], backend=backend)] == [
        "!",
        "ok",
    ]


def test_run_of_an_async_program_outside_a_loop(backend):
    @function
    async def prog(s):
        s += "x" + gen("y")
        return await s.aget("y")

    assert prog.run(backend=backend).ret_value == "ok"


def test_program_bodies_of_a_batch_run_concurrently(make_backend):
    barrier = threading.Barrier(4, timeout=10)

    def reply(prompt, params):
        barrier.wait()
        return "done"

    states = echo.run_batch(
        [{"word": str(i)} for i in range(4)], backend=make_backend(default=reply), num_threads=4
    )
    assert [s["out"] for s in states] == ["done"] * 4


def test_default_backend_is_used_when_run_names_none(backend):
    previous = get_default_backend()
    set_default_backend(backend)
    try:
        assert echo.run(word="hi")["out"] == "ok"
    finally:
        set_default_backend(previous)
    with pytest.raises(TypeError, match="not a Backend"):
        set_default_backend(object())


def test_run_batch_validates_its_arguments(backend):
    with pytest.raises(TypeError, match="list of kwargs dicts"):
        echo.run_batch({"word": "x"}, backend=backend)
    with pytest.raises(TypeError, match="item 1"):
        echo.run_batch([{"word": "x"}, "y"], backend=backend)
    with pytest.raises(ValueError, match="num_threads.*0"):
        echo.run_batch([{"word": "x"}], backend=backend, num_threads=0)


def test_progress_bar_counts_items(backend, capsys):
    states = echo.run_batch([{"word": "a"}, {"word": "b"}], backend=backend, progress_bar=True)
    assert [s["out"] for s in states] == ["ok", "ok"]
    assert "2/2" in capsys.readouterr().err


def test_text_iter_without_streaming_yields_what_each_step_appended(backend):
    state = streamed.run(backend=backend)
    assert "".join(state.text_iter()) == "A:ok"
    assert list(state.text_iter("a")) == ["ok"]


def test_an_async_program_error_reaches_the_awaiting_caller(make_backend):
    backend = make_backend(default=RuntimeError("no capacity"))

    @function
    async def prog(s):
        s += "x" + gen("y")
        return await s.aget("y")

    with pytest.raises(RuntimeError, match="no capacity"):
        asyncio.run(prog.run_async(backend=backend))


def test_run_batch_stores_a_bad_argument_per_item(backend):
    states = echo.run_batch([{"word": "a"}, {"wrd": "b"}], backend=backend)
    assert states[0]["out"] == "ok"
    assert isinstance(states[1].error(), TypeError)
    assert "wrd" in str(states[1].error())
