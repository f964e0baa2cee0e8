"""EBNF grammars (SGLang's `ebnf` field, GBNF as llama.cpp writes it): on /generate, on the
OpenAI routes and from the DSL's gen(ebnf=...), compiled by llguidance even on a server whose
default backend is outlines; a grammar that does not parse, or the outlines backend named for
one, is a 400 saying so."""

from __future__ import annotations

import re

import httpx
import pytest
import stemma
from stemma.lang import RuntimeEndpoint, function, gen
from stemma.lang.openai_messages import chat_body

GRAMMAR = r"""
root   ::= answer " " digits
answer ::= "yes" | "no"
digits ::= [0-9] [0-9]?
"""
LANGUAGE = re.compile(r"(yes|no) [0-9][0-9]?")


def test_constraint_takes_gbnf_and_lark() -> None:
    gbnf = stemma.Constraint(ebnf=GRAMMAR)
    assert gbnf.backend == "llguidance"
    assert gbnf.accepts("yes 42") and gbnf.accepts("no 7")
    assert not gbnf.accepts("maybe 4") and not gbnf.accepts("yes 123") and not gbnf.accepts("no")
    lark = stemma.Constraint(ebnf='start: ("yes" | "no") " " /[0-9]{1,2}/')
    assert lark.accepts("no 12") and not lark.accepts("no 123")


def test_a_grammar_needs_llguidance_and_must_parse() -> None:
    with pytest.raises(ValueError, match="ebnf grammars need the llguidance grammar backend"):
        stemma.Constraint(ebnf=GRAMMAR, backend="outlines")
    with pytest.raises(ValueError, match="invalid ebnf grammar: .*line 1"):
        stemma.Constraint(ebnf='root ::= ("a"')
    with pytest.raises(ValueError, match="ebnf"):
        stemma.Constraint(ebnf='root ::= missing "a"')


def test_generate_follows_the_grammar(server) -> None:
    sp = {"ebnf": GRAMMAR, "max_new_tokens": 12, "temperature": 0}
    with httpx.Client(base_url=server.url, timeout=60) as c:
        r = c.post("/generate", json={"text": "Answer:", "sampling_params": sp})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    assert LANGUAGE.fullmatch(out["text"]), out["text"]


def test_chat_completions_take_the_ebnf_field(server) -> None:
    fields = {"model": "tiny", "ebnf": GRAMMAR, "max_tokens": 12, "temperature": 0}
    chat = {**fields, "messages": [{"role": "user", "content": "Answer"}]}
    with httpx.Client(base_url=server.url, timeout=60) as c:
        r = c.post("/v1/chat/completions", json=chat)
        assert r.status_code == 200, r.text
        assert LANGUAGE.fullmatch(r.json()["choices"][0]["message"]["content"])
        r = c.post("/v1/completions", json={**fields, "prompt": "Answer:"})
        assert r.status_code == 200, r.text
        assert LANGUAGE.fullmatch(r.json()["choices"][0]["text"])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"ebnf": 'root ::= ("a"'}, "invalid ebnf grammar"),
        ({"ebnf": GRAMMAR, "grammar_backend": "outlines"}, "need the llguidance grammar backend"),
        ({"ebnf": GRAMMAR, "regex": "a"}, "at most one of"),
    ],
    ids=["unparsable", "outlines", "two-grammars"],
)
def test_bad_grammar_requests_are_400s(server, extra: dict, message: str) -> None:
    sp = {"max_new_tokens": 4, **extra}
    with httpx.Client(base_url=server.url, timeout=60) as c:
        r = c.post("/generate", json={"text": "x", "sampling_params": sp})
    assert r.status_code == 400 and message in r.text, r.text


@function
def yes_or_no(s):
    s += "Answer: " + gen("answer", ebnf=GRAMMAR, max_tokens=12, temperature=0)


def test_a_program_gens_under_a_grammar(server) -> None:
    state = yes_or_no.run(backend=RuntimeEndpoint(server.url))
    assert LANGUAGE.fullmatch(state["answer"]), state["answer"]
    with pytest.raises(ValueError, match="at most one of"):
        gen("x", ebnf=GRAMMAR, regex="a")


def test_a_grammar_in_each_openai_servers_field() -> None:
    messages = [{"role": "user", "content": "x"}]
    params = {"ebnf": GRAMMAR}
    assert chat_body("m", messages, params, "regex")["ebnf"] == GRAMMAR  # stemma, SGLang
    assert chat_body("m", messages, params, "gbnf")["grammar"] == GRAMMAR  # llama.cpp
    with pytest.raises(ValueError, match="gen\\(ebnf=...\\) cannot be expressed"):
        chat_body("m", messages, params, None)
