"""Exact text assembly, roles through the chat template, variables, scopes and nested programs."""

from __future__ import annotations

import json

import pytest
from stemma.lang import (
    assistant,
    assistant_begin,
    assistant_end,
    function,
    gen,
    gen_int,
    gen_string,
    greedy_token_selection,
    system,
    token_length_normalized,
    user,
)

SYS = "<|im_start|>system\n"
USER = "<|im_start|>user\n"
ASSISTANT = "<|im_start|>assistant\n"
END = "<|im_end|>\n"
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def test_text_and_captured_variable(make_backend):
    backend = make_backend(rules={"Q: 2+2?\nA:": " 4"})

    @function
    def qa(s, question):
        s += "Q: " + question + "\n"
        s += "A:" + gen("answer", max_tokens=4, stop="\n")
        s += "\nDone."

    state = qa.run(question="2+2?", backend=backend)
    assert state["answer"] == " 4"
    assert state.text() == "Q: 2+2?\nA: 4\nDone."
    [req] = backend.gen_requests()
    assert req["text"] == "Q: 2+2?\nA:"
    assert req["sampling_params"] == {"max_new_tokens": 4, "stop": "\n"}


def test_roles_render_the_chat_template_exactly(make_backend):
    backend = make_backend(rules={ASSISTANT: "Hello!"})

    @function
    def chat(s):
        s += system("Be brief.")
        s += user("Hi")
        s += assistant(gen("reply", max_tokens=8))

    state = chat.run(backend=backend)
    prompt = f"{SYS}Be brief.{END}{USER}Hi{END}{ASSISTANT}"
    assert state.text() == f"{prompt}Hello!{END}"
    assert state.messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
    ]
    [req] = backend.gen_requests()
    assert req["text"] == prompt
    assert req["sampling_params"]["stop"] == ["<|im_end|>"]


def test_default_system_prompt_is_inserted_before_a_first_user_message(make_backend):
    backend = make_backend(default="Yes.")

    @function
    def chat(s):
        with s.user():
            s += "Ready?"
        with s.assistant():
            s += gen("reply", stop=["\n"])

    state = chat.run(backend=backend)
    assert state.text() == f"{SYS}{DEFAULT_SYSTEM}{END}{USER}Ready?{END}{ASSISTANT}Yes.{END}"
    assert [m["role"] for m in state.messages()] == ["system", "user", "assistant"]
    assert backend.gen_requests()[0]["sampling_params"]["stop"] == ["\n", "<|im_end|>"]


def test_role_begin_end_forms_and_plain_template(make_backend):
    backend = make_backend(default="fine", chat_template=None)

    @function
    def chat(s):
        s += user("How are you?")
        s += assistant_begin()
        s += gen("reply")
        s += assistant_end()

    state = chat.run(backend=backend)
    assert state.text() == "User: How are you?\nAssistant: fine\n"
    assert "stop" not in backend.gen_requests()[0]["sampling_params"]


def test_nested_roles_fail_with_a_clear_error(backend):
    @function
    def bad(s):
        with s.user():
            s += system("no")

    with pytest.raises(ValueError, match="roles do not nest"):
        bad.run(backend=backend).text()


def test_var_scope_captures_everything_appended_inside(make_backend):
    backend = make_backend(rules={"Name: ": "Ada"})

    @function
    def card(s):
        s += "Card\n"
        with s.var_scope("body"):
            s += "Name: " + gen("name") + "\n"
            s += "Role: engineer"
        s += "\nEnd"

    state = card.run(backend=backend)
    assert state["name"] == "Ada"
    assert state["body"] == "Name: Ada\nRole: engineer"
    assert state.text() == "Card\nName: Ada\nRole: engineer\nEnd"
    assert state.get_meta_info("body") is None


def test_nested_program_call_runs_inline_on_the_same_state(make_backend):
    backend = make_backend(rules={"Tip: ": "sleep", "Why: ": "rest"})

    @function
    def tip(s, topic):
        s += f"Topic: {topic}\nTip: " + gen("tip") + "\n"

    @function
    def advice(s):
        s += "Advice\n"
        s += tip("health")
        s += "Why: " + gen("why")
        s["seen"] = s["tip"].upper()

    state = advice.run(backend=backend)
    assert state.text() == "Advice\nTopic: health\nTip: sleep\nWhy: rest"
    assert (state["tip"], state["why"], state["seen"]) == ("sleep", "rest", "SLEEP")


def test_program_called_with_a_state_returns_its_value(backend):
    @function
    def inner(s, x):
        s += f"[{x}]"
        return x * 2

    @function
    def outer(s):
        s["doubled"] = inner(s, 21)

    state = outer.run(backend=backend)
    assert (state.text(), state["doubled"]) == ("[21]", 42)


def test_program_level_defaults_apply_unless_the_gen_sets_its_own(backend):
    @function
    def two(s):
        s += "a" + gen("a")
        s += "b" + gen("b", temperature=0.7, max_tokens=5, stop=["x"])

    two.run(backend=backend, temperature=0.0, top_p=0.9, stop="\n").sync()
    first, second = backend.gen_requests()
    assert first["sampling_params"] == {
        "max_new_tokens": 128,
        "stop": "\n",
        "temperature": 0.0,
        "top_p": 0.9,
    }
    assert second["sampling_params"] == {
        "max_new_tokens": 5,
        "stop": ["x"],
        "temperature": 0.7,
        "top_p": 0.9,
    }


def test_run_rejects_unknown_keyword_arguments(backend):
    @function
    def prog(s, x):
        s += x

    with pytest.raises(TypeError, match="temprature"):
        prog.run(x="a", temprature=0.1, backend=backend)
    with pytest.raises(TypeError, match="regex"):
        prog.run(x="a", regex="a+", backend=backend)


def test_dtype_values_are_parsed_to_python_types(make_backend):
    backend = make_backend(rules={"n=": "42", "f=": "2.5", "b=": "True", "s=": '"hi \\"x\\""'})

    @function
    def typed(s):
        s += "n=" + gen_int("n") + " f=" + gen("f", dtype=float)
        s += " b=" + gen("b", dtype=bool) + " s=" + gen_string("s")

    state = typed.run(backend=backend)
    assert (state["n"], state["f"], state["b"], state["s"]) == (42, 2.5, True, '"hi \\"x\\""')
    regexes = [r["sampling_params"]["regex"] for r in backend.gen_requests()]
    assert regexes[0] == r"-?(0|[1-9][0-9]*)"
    assert regexes[2] == "(True|False)"


def test_json_schema_reaches_the_backend(make_backend):
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    backend = make_backend(rules={"json:": '{"x": 1}'})

    @function
    def constrained(s):
        s += "json:" + gen("obj", json_schema=schema)

    state = constrained.run(backend=backend)
    assert json.loads(state["obj"]) == {"x": 1}
    [obj] = backend.gen_requests()
    assert json.loads(obj["sampling_params"]["json_schema"]) == schema


def test_gen_with_choices_is_a_select_as_in_sglang():
    from stemma.lang.ir import Select

    picked = gen("pick", choices=["a+", "b.c"], choices_method=greedy_token_selection)
    assert isinstance(picked, Select)
    assert (picked.name, picked.choices, picked.method) == (
        "pick",
        ["a+", "b.c"],
        greedy_token_selection,
    )
    assert picked.temperature == 0.0
    assert gen(choices=["x"]).method is token_length_normalized
    with pytest.raises(ValueError, match="choices_method needs choices"):
        gen(choices_method=greedy_token_selection)


def test_json_schema_accepts_a_json_string_and_a_pydantic_model():
    pydantic = pytest.importorskip("pydantic")

    class Call(pydantic.BaseModel):
        tool: str

    from_model = json.loads(gen(json_schema=Call).params.json_schema)
    assert from_model["properties"]["tool"]["type"] == "string"
    assert gen(json_schema='{"type": "string"}').params.json_schema == '{"type": "string"}'


def test_gen_n_captures_a_list_and_appends_nothing(make_backend):
    backend = make_backend(rules={"Name:": ["Ada", "Bob", "Cy"]})

    @function
    def names(s):
        s += "Name:" + gen("names", n=3, temperature=1.0)

    state = names.run(backend=backend)
    assert state["names"] == ["Ada", "Bob", "Cy"]
    assert len(state.get_meta_info("names")) == 3
    assert state.text() == "Name:"
    assert backend.gen_requests()[0]["sampling_params"]["n"] == 3


def test_meta_info_and_logprob_options(backend):
    @function
    def prog(s):
        s += "x" + gen("y", return_logprob=True, top_logprobs_num=2)

    state = prog.run(backend=backend)
    meta = state.get_meta_info("y")
    assert meta["finish_reason"] == {"type": "stop", "matched": None}
    assert meta["prompt_tokens"] == 1
    [req] = backend.gen_requests()
    assert (req["return_logprob"], req["top_logprobs_num"]) == (True, 2)


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"max_tokens": -1}, ValueError, "max_new_tokens.*-1"),
        ({"temperature": "hot"}, TypeError, "temperature.*'hot'"),
        ({"top_p": 1.5}, ValueError, "top_p.*1.5"),
        ({"top_k": -2}, ValueError, "top_k.*-2"),
        ({"repetition_penalty": 3.0}, ValueError, r"repetition_penalty must be in \(0, 2\]"),
        ({"seed": -1}, ValueError, "seed.*-1"),
        ({"regex": "a", "choices": ["a"]}, ValueError, "at most one"),
        ({"dtype": list}, ValueError, "dtype.*list"),
        ({"choices": []}, ValueError, "non-empty list"),
        ({"json_schema": "{not json"}, ValueError, "json_schema"),
        ({"json_schema": 3}, TypeError, "json_schema.*3"),
        ({"n": 0}, ValueError, "n must be >= 1"),
        ({"stop": 5}, TypeError, "stop.*5"),
    ],
)
def test_bad_gen_arguments_name_the_value(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        gen("x", **kwargs)


def test_appending_a_non_text_value_is_a_type_error(backend):
    @function
    def prog(s):
        s += 5

    with pytest.raises(TypeError, match="cannot append int 5"):
        prog.run(backend=backend)


def test_reading_an_unknown_variable_names_it(backend):
    @function
    def prog(s):
        s += "x" + gen("known")

    with pytest.raises(KeyError, match="missing"):
        prog.run(backend=backend)["missing"]
