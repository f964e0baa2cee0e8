"""stemma.OpenAI, the DSL's backend over an OpenAI chat API, against stemma's own /v1: the
same program gives the same text as over /generate, constraints hold, and what the chat API
cannot express fails naming the primitive."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import stemma
from stemma import assistant, function, gen, select, system, user
from stemma.examples import multi_turn_chat, tool_call_agent

DATE = r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]"


@function
def triage(s, ticket: str):
    s += system("You are a support engineer.")
    s += user(f"Ticket: {ticket}\nHow urgent is it?")
    s += assistant(select("urgency", choices=["low", "medium", "high"]))
    s += user("Give a date for the fix as YYYY-MM-DD.")
    s += assistant(gen("date", regex=DATE, max_tokens=16))
    s += user("Reply to the customer in one sentence.")
    s += assistant(gen("reply", max_tokens=12, temperature=0))


@pytest.fixture(scope="module")
def backend(smol_server):
    return stemma.OpenAI("smollm2-135m", base_url=smol_server.url + "/v1")


def test_the_server_is_probed_for_its_regex_field(backend):
    assert backend.grammar() == "regex"


def test_a_program_gives_the_same_text_as_over_generate(backend, smol_server):
    over_chat = triage.run(ticket="The login page times out.", backend=backend)
    over_chat.sync()  # one program at a time: the same batches, so the same greedy text
    native = stemma.RuntimeEndpoint(smol_server.url)
    over_generate = triage.run(ticket="The login page times out.", backend=native)
    assert over_chat["urgency"] in ("low", "medium", "high")
    assert re.fullmatch(DATE, over_chat["date"])
    assert over_chat["reply"] == over_generate["reply"]
    assert over_chat.get_meta_info("reply")["cached_tokens"] > 0


def test_the_example_programs_run_over_the_chat_api(backend):
    messages = multi_turn_chat.run_example(backend, max_tokens=6)
    assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * 4
    result = tool_call_agent.run_example(backend)
    jsonschema.validate(result["call"], tool_call_agent.CALL_SCHEMA)


def test_streaming_yields_the_text(backend):
    @function
    def hello(s):
        s += user("Say hello.")
        s += assistant(gen("greeting", max_tokens=8, temperature=0))

    state = hello.run(backend=backend, stream=True)
    streamed = "".join(state.text_iter("greeting"))
    assert streamed == state["greeting"] and streamed


def test_what_the_chat_api_cannot_express_names_the_primitive(backend):
    @function
    def outside_a_turn(s):
        s += "Plain text, " + gen("x", max_tokens=4)

    @function
    def prefilled_turn(s):
        s += user("Count.")
        s += assistant("One, two, " + gen("x", max_tokens=4))

    with pytest.raises(ValueError, match="gen outside an assistant turn"):
        outside_a_turn.run(backend=backend).sync()
    with pytest.raises(ValueError, match="gen after text inside an assistant turn"):
        prefilled_turn.run(backend=backend).sync()
    gbnf_only = stemma.OpenAI("m", base_url=backend.base_url, grammar="gbnf")

    @function
    def regex_gen(s):
        s += user("A number?")
        s += assistant(gen("n", dtype=int, max_tokens=4))

    with pytest.raises(ValueError, match=r"gen\(regex=...\)"):
        regex_gen.run(backend=gbnf_only).sync()
    with pytest.raises(ValueError, match="tokenizer"):
        backend.tokenize("x")


def test_select_without_a_grammar_field_uses_top_logprobs(backend):
    plain = stemma.OpenAI("smollm2-135m", base_url=backend.base_url, grammar="none")

    @function
    def yes_no(s):
        s += user("Is water wet? Answer yes or no.")
        s += assistant(select("answer", choices=["yes", "no"]))

    state = yes_no.run(backend=plain)
    assert state["answer"] in ("yes", "no")
    assert state.get_meta_info("answer")["first_token_logprob"] <= 0


def test_json_schema_goes_in_response_format(backend):
    @function
    def person(s):
        s += user("Describe a person as JSON.")
        s += assistant(gen("json", json_schema=SCHEMA, max_tokens=48, temperature=0))

    jsonschema.validate(json.loads(person.run(backend=backend)["json"]), SCHEMA)


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
