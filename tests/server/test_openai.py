"""The OpenAI routes through the official `openai` client, against the tiny model."""

from __future__ import annotations

import openai
import pytest
from stemma.bench.tool_schemas import weather_tool

USER = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture()
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_chat_uses_the_chat_template(client, server):
    r = client.chat.completions.create(
        model="tiny", messages=USER, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    prompt = server.engine.apply_chat_template(USER)
    expected = server.engine.generate(
        prompt, {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    )
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == expected["text"]
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(server.engine.tokenize(prompt))
    assert r.usage.completion_tokens == 6
    assert r.usage.total_tokens == r.usage.prompt_tokens + 6


def test_streaming_chat_with_usage(client):
    kwargs = dict(model="tiny", messages=USER, max_tokens=8, temperature=0)
    extra = {"ignore_eos": True}
    whole = client.chat.completions.create(**kwargs, extra_body=extra)
    stream = client.chat.completions.create(
        **kwargs, extra_body=extra, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_completions_n_seed_stop_and_logprobs(client):
    r = client.completions.create(
        model="tiny",
        prompt="The quick brown fox",
        max_tokens=5,
        n=3,
        seed=7,
        temperature=1.0,
        logprobs=2,
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) for c in r.choices)
    assert all(len(top) == 2 for c in r.choices for top in c.logprobs.top_logprobs)
    assert r.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in r.choices)
    again = client.completions.create(
        model="tiny", prompt="The quick brown fox", max_tokens=5, n=3, seed=7, temperature=1.0
    )
    assert [c.text for c in again.choices] == [c.text for c in r.choices]
    assert len({c.text for c in r.choices}) > 1  # seed, seed+1, ... per sample
    echo = client.completions.create(model="tiny", prompt="The quick", max_tokens=2, echo=True)
    assert echo.choices[0].text.startswith("The quick")


def test_completions_stream_and_token_prompts(client, server):
    ids = server.engine.tokenize("Numbers: 0 1 2")
    whole = client.completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0)
    stream = client.completions.create(
        model="tiny", prompt=ids, max_tokens=6, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in stream) == whole.choices[0].text


def test_chat_logprobs(client):
    r = client.chat.completions.create(
        model="tiny",
        messages=USER,
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    assert all(len(entry.top_logprobs) == 3 for entry in content)
    assert all(entry.logprob <= 0 for entry in content)


def test_cached_tokens_on_a_repeated_prefix(client):
    system = {"role": "system", "content": "You are terse. " * 12}
    kwargs = dict(model="tiny", max_tokens=2, temperature=0)
    client.chat.completions.create(messages=[system, *USER], **kwargs)
    second = client.chat.completions.create(
        messages=[system, {"role": "user", "content": "Another question"}], **kwargs
    )
    assert second.usage.prompt_tokens_details.cached_tokens > 20


def test_models_route(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_unknown_model_and_bad_fields_raise_client_errors(client):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-4", messages=USER)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model="tiny", messages=USER, max_tokens=10**6)
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="tiny", messages=[])


def test_tool_choice_auto_without_a_call_is_content(client):
    r = client.chat.completions.create(
        model="tiny",
        messages=USER,
        tools=[weather_tool()],
        max_tokens=5,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    # gibberish from the tiny model is not a JSON call, so it stays content
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].message.tool_calls is None
    assert isinstance(r.choices[0].message.content, str)
