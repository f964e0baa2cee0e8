"""SGLang's structural_tag (constrained/structural_tag.py): free text until a trigger, then the
tagged structure must be completed under its schema. Checked token by token through
llguidance, over /generate and as a chat response_format; a malformed tag is a 400 naming the
field at fault."""

from __future__ import annotations

import json

import httpx
import pytest
import stemma
from stemma.bench.tool_schemas import weather_args
from stemma.runtime.constrained.structural_tag import structural_tag_grammar

WEATHER = weather_args(("city",), max_city_len=12, closed=True)
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}
TAG = {
    "structures": [
        {"begin": "<function=get_weather>", "schema": WEATHER, "end": "</function>"},
        {"begin": "<function=get_time>", "schema": TIME, "end": "</function>"},
    ],
    "triggers": ["<function="],
}


@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        ("No tool is needed here.", True),
        ('Let me check. <function=get_weather>{"city": "Paris"}</function>', True),
        (
            '<function=get_time>{"zone":"UTC"}</function> and then <function=get_weather>'
            '{"city":"Oslo"}</function> done',
            True,
        ),
        ('<function=get_weather>{"town": "Paris"}</function>', False),  # closed object
        ('<function=get_time>{"zone":"PST"}</function>', False),
        ("<function=get_news>{}</function>", False),  # the trigger opens a known tag only
        ('<function=get_weather>{"city": "Paris"}', False),  # an opened tag must end
    ],
)
def test_text_between_tags_is_free_and_tags_follow_their_schema(text, accepted) -> None:
    c = stemma.Constraint(ebnf=structural_tag_grammar(TAG))
    assert c.accepts(text) == accepted


@pytest.mark.parametrize(
    ("tag", "message"),
    [
        ("{not json", "structural_tag is not valid JSON"),
        ({"structures": [], "triggers": ["<f"]}, "structures must be a non-empty list"),
        ({**TAG, "triggers": []}, "triggers must be a non-empty list"),
        ({**TAG, "triggers": ["<tool"]}, r"structures\[0\].begin '<function=get_weather>'"),
        ({**TAG, "extra": 1}, "unknown fields \\['extra'\\]"),
        ({"format": {"type": "any_text"}}, "'format' form is not supported"),
        ({**TAG, "structures": [{"begin": "<function=x>", "end": ""}]}, "begin, schema and end"),
    ],
)
def test_a_malformed_tag_names_its_field(tag, message) -> None:
    with pytest.raises(ValueError, match=message):
        structural_tag_grammar(tag)


def test_generate_and_chat_take_a_structural_tag(server) -> None:
    sp = {"structural_tag": json.dumps(TAG), "max_new_tokens": 24, "temperature": 0}
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "Weather?"}]}
    chat |= {"max_tokens": 24, "temperature": 0, "response_format": {"type": "structural_tag"}}
    chat["response_format"] |= TAG
    check = stemma.Constraint(ebnf=structural_tag_grammar(TAG))
    with httpx.Client(base_url=server.url, timeout=60) as c:
        r = c.post("/generate", json={"text": "<function=get_weather>", "sampling_params": sp})
        assert r.status_code == 200, r.text
        text = r.json()["text"]
        r = c.post("/v1/chat/completions", json=chat)
        assert r.status_code == 200, r.text
        content = r.json()["choices"][0]["message"]["content"]
    for out in (text, content):  # finished or cut at max tokens: a prefix the tag allows
        m = check.matcher()
        assert all(m.accept(t) for t in check.tokenizer.encode(out)), out


def test_a_malformed_tag_is_a_400(server) -> None:
    bad = {**TAG, "triggers": ["<tool"]}
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    chat["response_format"] = {"type": "structural_tag", **bad}
    sp = {"structural_tag": json.dumps(bad), "max_new_tokens": 2}
    with httpx.Client(base_url=server.url, timeout=60) as c:
        r = c.post("/v1/chat/completions", json=chat)
        assert r.status_code == 400 and "starts with none of the triggers" in r.text, r.text
        r = c.post("/generate", json={"text": "x", "sampling_params": sp})
        assert r.status_code == 400 and "starts with none of the triggers" in r.text, r.text
