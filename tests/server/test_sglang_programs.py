"""The programs of SGLang's frontend suite (its test/test_programs.py), written anew for stemma,
each run on SmolLM2-135M both in-process (stemma.Runtime) and over HTTP (RuntimeEndpoint to a
live server on the same engine).

SGLang asserts answers a large model knows; a 135M model does not, so these assert what holds
at temperature 0 for any model: the shape of the result, that constrained output parses,
that the text is assembled exactly from its parts, and that shared prefixes come from the
cache. Generation lengths are kept short so the module stays fast.
"""

from __future__ import annotations

import ast
import json
import operator
import re

import pytest
import stemma
from stemma import (
    RuntimeEndpoint,
    assistant,
    function,
    gen,
    gen_int,
    gen_string,
    select,
    system,
    user,
)
from stemma.lang.constraints import REGEX_FLOAT, REGEX_INT, REGEX_STR


@pytest.fixture(scope="module", params=["in_process", "http"])
def backend(request, smol_server):
    if request.param == "in_process":
        return stemma.Runtime(engine=smol_server.engine)
    return RuntimeEndpoint(smol_server.url)


def cached(state, name: str) -> int:
    return state.get_meta_info(name)["cached_tokens"]


# -- few-shot QA, with run_batch ----------------------------------------------------------------

QA_SHOTS = (
    "Questions with answers.\n\nQ: Capital of France?\nA: Paris\nQ: Capital of Italy?\nA: Rome\n"
)


@function
def few_shot_qa(s, question):
    s += QA_SHOTS
    s += "Q: " + question + "\n"
    s += "A:" + gen("answer", stop="\n", max_tokens=12, temperature=0)


def test_few_shot_qa(backend):
    state = few_shot_qa.run(question="Capital of Japan?", backend=backend)
    answer = state["answer"]
    assert "\n" not in answer
    assert state.text() == QA_SHOTS + "Q: Capital of Japan?\nA:" + answer
    states = few_shot_qa.run_batch(
        [{"question": "Capital of Spain?"}, {"question": "Capital of Peru?"}], backend=backend
    )
    shots_len = len(backend.tokenize(QA_SHOTS))
    for state in states:
        assert isinstance(state["answer"], str) and "\n" not in state["answer"]
        assert cached(state, "answer") >= shots_len - 1


# -- MT-bench: two turns, written with role calls and role blocks ------------------------------


def test_mt_bench(backend):
    @function
    def two_turns(s, first, second):
        s += system("You are a helpful assistant.")
        s += user(first)
        s += assistant(gen("answer_1"))
        with s.user():
            s += second
        with s.assistant():
            s += gen("answer_2")

    state = two_turns.run(
        first="Describe Hawaii.",
        second="Now in one word.",
        temperature=0.7,
        max_new_tokens=12,
        backend=backend,
    )
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[2]["content"] == state["answer_1"]
    assert messages[4]["content"] == state["answer_2"]
    assert messages[3]["content"] == "Now in one word."


# -- select, and gen(choices=...) scored the same way -------------------------------------------


@function
def true_or_false(s, statement):
    s += "Is the statement True, False or Unknown?\n"
    s += "Statement: The capital of France is Pairs.\nAnswer: False\n"
    s += "Statement: " + statement + "\n"
    s += "Answer:" + select("answer", ["True", "False", "Unknown"])


def test_select(backend):
    for statement in ["Berlin is in Germany.", "Tokyo is in Canada.", "Purple beats green."]:
        state = true_or_false.run(statement=statement, backend=backend)
        assert state["answer"] in ("True", "False", "Unknown")
        assert state.text().endswith("Answer:" + state["answer"])
        assert state.get_meta_info("answer")["decision"] == state["answer"]

    @function
    def as_gen(s, statement):
        true_or_false(s, statement)

    @function
    def with_gen_choices(s, statement):
        s += "Is the statement True, False or Unknown?\n"
        s += "Statement: The capital of France is Pairs.\nAnswer: False\n"
        s += "Statement: " + statement + "\n"
        s += "Answer:" + gen("answer", choices=["True", "False", "Unknown"])

    a = as_gen.run(statement="Berlin is in Germany.", backend=backend)
    a.sync()  # one program at a time: the same batches, so the same scores
    b = with_gen_choices.run(statement="Berlin is in Germany.", backend=backend)
    assert a["answer"] == b["answer"] and a.text() == b.text()


# -- typed and constrained gens -----------------------------------------------------------------


def test_decode_int(backend):
    @function
    def numbers(s):
        s += "The number of hours in a day is " + gen_int("hours", max_tokens=6) + "\n"
        s += "The number of days in a year is " + gen_int("days", max_tokens=6) + "\n"

    state = numbers.run(temperature=0, backend=backend)
    hours, days = state["hours"], state["days"]
    assert type(hours) is int and type(days) is int
    assert state.text() == (
        f"The number of hours in a day is {hours}\nThe number of days in a year is {days}\n"
    )


def test_decode_json_regex(backend):
    @function
    def city(s):
        s += "A JSON object describing Paris:\n"
        with s.var_scope("json_output"):
            s += "{\n"
            s += '  "name": ' + gen(regex=REGEX_STR, max_tokens=12) + ",\n"
            s += '  "population": ' + gen(regex=REGEX_INT, stop=[" ", "\n"], max_tokens=8) + ",\n"
            s += '  "area": ' + gen(regex=REGEX_INT, stop=[" ", "\n"], max_tokens=8) + ",\n"
            s += '  "latitude": ' + gen(regex=REGEX_FLOAT, stop=[" ", "\n"], max_tokens=8) + "\n"
            s += "}"

    state = city.run(temperature=0, backend=backend)
    obj = json.loads(state["json_output"])
    assert isinstance(obj["name"], str) and isinstance(obj["population"], int)
    assert state.text().endswith(state["json_output"])


def test_decode_json(backend):
    @function
    def city(s):
        s += "A JSON object describing Paris:\n"
        with s.var_scope("json_output"):
            s += "{\n"
            s += '  "name": ' + gen_string() + ",\n"
            s += '  "population": ' + gen_int() + ",\n"
            s += '  "area": ' + gen(dtype=int) + ",\n"
            s += '  "country": ' + gen_string() + ",\n"
            s += '  "timezone": ' + gen(dtype=str) + "\n"
            s += "}"

    state = city.run(max_new_tokens=12, temperature=0, backend=backend)
    obj = json.loads(state["json_output"])
    assert isinstance(obj["name"], str) and isinstance(obj["population"], int)


def test_regex(backend):
    ip = r"((25[0-5]|2[0-4]\d|[01]?\d\d?).){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"

    @function
    def dns(s):
        s += "Q: What is the IP address of the Google DNS servers?\n"
        s += "A: " + gen("answer", temperature=0, regex=ip, max_tokens=16)

    assert re.fullmatch(ip, dns.run(backend=backend)["answer"])


def test_dtype_gen(backend):
    @function
    def typed(s):
        s += "Q: What does DNS stand for?\n"
        s += "A: It stands for " + gen("str_res", dtype=str, stop="\n", max_tokens=12) + "\n"
        s += "Q: Which year was DNS invented?\nA: " + gen("int_res", dtype=int) + "\n"
        s += "Q: What is the value of pi?\nA: " + gen("float_res", dtype=float) + "\n"
        s += "Q: Is the sky blue?\nA: " + gen("bool_res", dtype=bool) + "\n"

    state = typed.run(max_new_tokens=8, temperature=0, backend=backend)
    assert state["str_res"].startswith('"')  # SGLang's str gen: the quoted text, as generated
    assert type(state["int_res"]) is int and type(state["bool_res"]) is bool
    assert isinstance(state["float_res"], float)
    assert int(state["int_res"]) == state["int_res"]


def test_gen_min_new_tokens(backend):
    @function
    def convo(s):
        s += user("What is the capital of the United States?")
        s += assistant(gen("answer", min_tokens=12, max_tokens=14))

    state = convo.run(temperature=0, backend=backend)
    assert state.get_meta_info("answer")["completion_tokens"] >= 12


# -- programs that read their own variables -----------------------------------------------------


def test_expert_answer(backend):
    @function
    def expert(s, question):
        s += "Question: " + question + "\n"
        s += "A good person to answer this question is" + gen("expert", stop=[".", "\n"]) + ".\n"
        s += "For example," + s["expert"] + " would answer that " + gen("answer", stop=".") + "."

    state = expert.run(
        question="What is the capital of France?", max_new_tokens=12, backend=backend
    )
    assert state.text() == (
        "Question: What is the capital of France?\n"
        f"A good person to answer this question is{state['expert']}.\n"
        f"For example,{state['expert']} would answer that {state['answer']}."
    )


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculate(expression: str) -> str:
    """+, - and * of integers, else "error" (the model writes what it likes)."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(expression)

    try:
        return str(value(ast.parse(expression.strip(), mode="eval").body))
    except (SyntaxError, ValueError, RecursionError):
        return "error"


def test_tool_use(backend):
    @function
    def tool_use(s, lhs, rhs):
        s += "Use calculate(expression) for arithmetic.\n"
        s += "For example,\ncalculate(1+2)=3\ncalculate(3*4)=12\n"
        s += f"Question: What is the product of {lhs} and {rhs}?\n"
        s += "Answer: The answer is calculate(" + gen("expression", stop=")") + ") = "
        with s.var_scope("answer"):
            s += calculate(s["expression"])

    state = tool_use(lhs=257, rhs=983, temperature=0, max_new_tokens=12, backend=backend)
    assert state["answer"] == calculate(state["expression"])
    assert state.text().endswith(f"calculate({state['expression']}) = {state['answer']}")


def test_react(backend):
    @function
    def react(s, question):
        s += "Question: Where does the founder of Microsoft live?\n"
        s += "Thought 1: I need to search for the founder of Microsoft.\n"
        s += "Action 1: Search [Founder of Microsoft].\n"
        s += "Observation 1: The founder of Microsoft is Bill Gates.\n"
        s += "Thought 2: The answer is the United States.\n"
        s += "Action 2: Finish [United States].\n\n"
        s += "Question: " + question + "\n"
        for i in range(1, 4):
            s += f"Thought {i}:" + gen(stop=[".", "\n"]) + ".\n"
            s += f"Action {i}: " + select(f"action_{i}", ["Search", "Finish"])
            if s[f"action_{i}"] == "Search":
                s += " [" + gen(stop="]") + "].\n"
                s += f"Observation {i}:" + gen(stop=[".", "\n"]) + ".\n"
            else:
                s += " [" + gen("answer", stop="]") + "].\n"
                break

    state = react.run(
        question="Where does the creator of Linux live?",
        max_new_tokens=8,
        temperature=0,
        backend=backend,
    )
    actions = [state[f"action_{i}"] for i in range(1, 4) if f"action_{i}" in state]
    assert actions and set(actions) <= {"Search", "Finish"}
    assert ("answer" in state) == (actions[-1] == "Finish")


# -- fork / join -------------------------------------------------------------------------------


def test_parallel_decoding(backend):
    num_tips = 3

    @function
    def tips(s, topic):
        s += "Act as a helpful assistant.\n"
        s += "USER: Give some tips for " + topic + ".\n"
        s += f"ASSISTANT: Okay. Here are {num_tips} concise tips:\n"
        for i in range(1, 1 + num_tips):
            s += f"{i}." + gen(max_tokens=6, stop=[".", "\n"]) + ".\n"
        forks = s.fork(num_tips)
        for i in range(num_tips):
            forks[i] += f"Now, I expand tip {i + 1} into a paragraph:\nTip {i + 1}:"
            forks[i] += gen("detailed_tip", 8, stop=["\n\n"])
        forks.join()
        s += "Here are these tips with detailed explanation:\n"
        for i in range(num_tips):
            s += f"Tip {i + 1}:" + forks[i]["detailed_tip"] + "\n"
        s += "\nIn summary," + gen("summary", max_tokens=8)
        return forks

    state = tips.run(topic="writing a blog post", temperature=0, backend=backend)
    forks = state.ret_value
    detailed = state["detailed_tip"]
    assert detailed == [forks[i]["detailed_tip"] for i in range(num_tips)]
    assert isinstance(state["summary"], str)
    shared = forks[0].text()[: forks[0].text().index("Now, I expand")]
    for i in range(num_tips):
        assert f"Tip {i + 1}:{detailed[i]}\n" in state.text()
        assert cached(forks[i], "detailed_tip") >= len(backend.tokenize(shared)) - 1


def test_parallel_encoding(backend):
    @function
    def encode(s, question, contexts):
        s += "USER: I will ask a question based on some statements.\n"
        s += "ASSISTANT: Sure.\nUSER: Please memorize these statements.\n"
        forks = s.fork(len(contexts))
        forks += lambda i: f"Statement {i}: " + contexts[i] + "\n"
        forks.join(mode="concate_and_append")
        s += "Now answer the question.\nQuestion: " + question + "\n"
        s += "ASSISTANT:" + gen("answer", max_tokens=8)

    contexts = ["Ethan is the father of Liam.", "Noah is the father of Julian."]
    state = encode.run(
        question="Who is Julian's father?", contexts=contexts, temperature=0, backend=backend
    )
    statements = "".join(f"Statement {i}: {c}\n" for i, c in enumerate(contexts))
    assert statements + "Now answer the question.\n" in state.text()
    assert state.text().endswith("ASSISTANT:" + state["answer"])


# -- streaming ---------------------------------------------------------------------------------


def test_stream(backend):
    @function
    def qa(s, question):
        s += system("You are a helpful assistant.")
        s += user(question)
        s += assistant(gen("answer", max_tokens=10))

    state = qa.run(question="Describe Hawaii.", stream=True, temperature=0, backend=backend)
    assert "".join(state.text_iter()) == state.text()
    state = qa.run(question="Describe Hawaii.", stream=True, temperature=0, backend=backend)
    assert "".join(state.text_iter("answer")) == state["answer"]


# -- HellaSwag-style select over a batch, list and generator forms ------------------------------

SWAG_SHOTS = (
    "A man is sitting on a roof. He starts pulling up roofing.\n\n"
    "A woman pours water into a glass. She drinks the water.\n\n"
)
SWAG = [
    ("A boy kicks a ball. The ball", [" rolls away.", " sings a song.", " turns blue."]),
    ("A cook cracks an egg. She", [" fries it.", " mails it.", " paints it."]),
    ("The dog hears a knock. It", [" barks.", " writes a letter.", " flies."]),
]


def test_hellaswag_select(backend):
    @function
    def swag(s, question, choices):
        s += SWAG_SHOTS + question
        s += select("answer", choices=choices)

    items = [{"question": q, "choices": c} for q, c in SWAG]
    listed = swag.run_batch(items, temperature=0, num_threads=4, backend=backend)
    generated = swag.run_batch(items, temperature=0, backend=backend, generator_style=True)
    picks = [c.index(state["answer"]) for (_, c), state in zip(SWAG, listed)]
    assert picks == [c.index(state["answer"]) for (_, c), state in zip(SWAG, generated)]


# -- SGLang's API speculation for chat backends: accepted, and the radix cache does the rest ----


def test_completion_speculative(backend):
    def body(s):
        s += "Construct a character in this format:\n"
        s += "Name: Steve Jobs.\nBirthday: February 24, 1955.\nJob: Apple CEO.\n"
        s += "\nPlease generate new Name, Birthday and Job.\n"
        s += "Name:" + gen("name", stop="\n") + "\nBirthday:" + gen("birthday", stop="\n")
        s += "\nJob:" + gen("job", stop="\n") + "\n"

    spec = function(num_api_spec_tokens=64)(body)
    plain = function(body)
    names = ("name", "birthday", "job")
    first = spec.run(temperature=0, max_new_tokens=8, backend=backend)
    # run() returns when the body has queued its gens; reading them waits until they are done,
    # so the second run starts after the first has cached the prefix, not beside it.
    expected = [first[k] for k in names]
    second = plain.run(temperature=0, max_new_tokens=8, backend=backend)
    assert [second[k] for k in names] == expected
    prefix = "Construct a character in this format:\n"
    assert cached(second, "name") >= len(backend.tokenize(prefix))


def test_chat_completion_speculative(backend):
    @function(num_api_spec_tokens=256)
    def character(s):
        s += system("You are a helpful assistant.")
        s += user("Construct a character in this format:")
        s += assistant("Name: Steve Jobs.\nBirthday: February 24, 1955.\nJob: Apple CEO.\n")
        s += user("Please generate new Name, Birthday and Job.\n")
        s += assistant(
            "Name:"
            + gen("name", stop="\n")
            + "\nBirthday:"
            + gen("birthday", stop="\n")
            + "\nJob:"
            + gen("job", stop="\n")
        )

    state = character.run(temperature=0, max_new_tokens=8, backend=backend)
    reply = state.messages()[-1]
    assert reply["role"] == "assistant"
    assert reply["content"].startswith("Name:" + state["name"] + "\nBirthday:")
