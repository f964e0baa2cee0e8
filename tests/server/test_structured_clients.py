"""The structured-output client libraries against `stemma serve` unchanged: instructor, the
openai SDK's `parse` and LangChain's `with_structured_output`, each in every mode it offers
that hands the server the schema to decode under, over ten pydantic models (bounds, Literal,
Optional, nested models, lists, enums). Greedy, max_tokens 200, the default server (outlines,
with schemas it cannot honour routed to llguidance): every response parses on its first
attempt and finishes by itself, never by max_tokens.

instructor's JSON mode and LangChain's json_mode send `response_format: json_object` and the
schema only as prose (or not at all), so the server cannot decode under it; they are not here.
instructor's PARALLEL_TOOLS says tool_choice "auto": the model decides whether to call, and
SmolLM2-135M opens a call for 1 of these 10 prompts, so it is not here either (every call a
reply opens parses: test_tool_choice_auto.py). All modes run at once, as one engine batch."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from typing import Any, Literal

import httpx
import instructor
import openai
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

MODEL = "smollm2-135m"
MAX_TOKENS = 200


class Weather(BaseModel):
    city: str = Field(max_length=24)
    unit: Literal["celsius", "fahrenheit"]


class Person(BaseModel):
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=120)


class Address(BaseModel):
    city: str = Field(max_length=24)
    country: str = Field(max_length=24)


class Employee(BaseModel):
    name: str = Field(max_length=24)
    address: Address


class Contact(BaseModel):
    name: str = Field(max_length=24)
    email: str | None = Field(default=None, max_length=40)


class Color(str, Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Fruit(BaseModel):
    name: str = Field(max_length=24)
    color: Color


class Tags(BaseModel):
    tags: list[str] = Field(max_length=3)


class Step(BaseModel):
    explanation: str = Field(max_length=60)
    output: str = Field(max_length=20)


class MathAnswer(BaseModel):
    steps: list[Step] = Field(max_length=3)
    final_answer: str = Field(max_length=20)


class Review(BaseModel):
    sentiment: Literal["positive", "negative", "neutral"]
    stars: int = Field(ge=1, le=5)


class Item(BaseModel):
    name: str = Field(max_length=20)
    quantity: int = Field(ge=1, le=10)


class Order(BaseModel):
    items: list[Item] = Field(max_length=3)


class Profile(BaseModel):
    name: str = Field(max_length=24)
    home: Address | None = None


CASES: list[tuple[type[BaseModel], str]] = [
    (Weather, "What is the weather in Paris, in celsius?"),
    (Person, "Alice is 30 years old."),
    (Employee, "Bob works from Paris, France."),
    (Contact, "Contact Carol at carol@example.com."),
    (Fruit, "A ripe apple is red."),
    (Tags, "Tag this post about Python and testing."),
    (MathAnswer, "Solve 8x + 7 = -23."),
    (Review, "Great phone, I love it! Five stars."),
    (Order, "I want 2 apples and 3 pears."),
    (Profile, "Dana lives in Oslo, Norway."),
]


def check_values(out: BaseModel) -> None:
    """The constraints each model states, read back from the parsed values."""
    if isinstance(out, Weather):
        assert out.unit in ("celsius", "fahrenheit") and len(out.city) <= 24
    elif isinstance(out, Person):
        assert isinstance(out.age, int) and 0 <= out.age <= 120
    elif isinstance(out, Employee):
        assert isinstance(out.address, Address) and len(out.address.country) <= 24
    elif isinstance(out, Contact):
        assert out.email is None or len(out.email) <= 40
    elif isinstance(out, Fruit):
        assert isinstance(out.color, Color)
    elif isinstance(out, Tags):
        assert len(out.tags) <= 3 and all(isinstance(t, str) for t in out.tags)
    elif isinstance(out, MathAnswer):
        assert len(out.steps) <= 3 and all(isinstance(s, Step) for s in out.steps)
    elif isinstance(out, Review):
        assert out.sentiment in ("positive", "negative", "neutral") and 1 <= out.stars <= 5
    elif isinstance(out, Order):
        assert len(out.items) <= 3 and all(1 <= i.quantity <= 10 for i in out.items)
    else:
        assert isinstance(out, Profile)
        assert out.home is None or isinstance(out.home, Address)


class Recorder:
    """An httpx client whose responses' finish reasons are kept: a client hides them."""

    def __init__(self) -> None:
        self.finish_reasons: list[str] = []

    def client(self) -> httpx.Client:
        return httpx.Client(event_hooks={"response": [self._record]}, timeout=120)

    def _record(self, response: httpx.Response) -> None:
        response.read()
        assert response.status_code == 200, response.text
        self.finish_reasons += [c["finish_reason"] for c in response.json()["choices"]]


Ask = Callable[[type[BaseModel], str], BaseModel]


def _user(prompt: str) -> list[Any]:
    return [{"role": "user", "content": prompt}]


def _instructor(url: str, http: httpx.Client, mode: instructor.Mode) -> Ask:
    client = instructor.from_openai(
        openai.OpenAI(base_url=url, api_key="none", http_client=http, max_retries=0), mode=mode
    )

    def ask(model: type[BaseModel], prompt: str) -> BaseModel:
        return client.chat.completions.create(
            model=MODEL,
            response_model=model,
            messages=_user(prompt),
            temperature=0,
            max_tokens=MAX_TOKENS,
            max_retries=0,  # one attempt: a reask would hide a failure
        )

    return ask


def _openai_parse(url: str, http: httpx.Client, as_tool: bool) -> Ask:
    """`parse` with the model as response_format, or as a forced strict tool (closed objects)."""
    client = openai.OpenAI(base_url=url, api_key="none", http_client=http, max_retries=0)

    def ask(model: type[BaseModel], prompt: str) -> BaseModel:
        how: dict[str, Any] = {"response_format": model}
        if as_tool:
            how = {"tools": [openai.pydantic_function_tool(model)], "tool_choice": "required"}
        r = client.chat.completions.parse(
            model=MODEL, messages=_user(prompt), temperature=0, max_tokens=MAX_TOKENS, **how
        )
        message = r.choices[0].message
        return message.tool_calls[0].function.parsed_arguments if as_tool else message.parsed

    return ask


def _langchain(url: str, http: httpx.Client, method: str, strict: bool | None = None) -> Ask:
    llm = ChatOpenAI(
        model=MODEL,
        base_url=url,
        api_key="none",
        temperature=0,
        max_tokens=MAX_TOKENS,
        max_retries=0,
        http_client=http,
    )

    def ask(model: type[BaseModel], prompt: str) -> BaseModel:
        return llm.with_structured_output(model, method=method, strict=strict).invoke(prompt)

    return ask


MODES = [
    "instructor-TOOLS",
    "instructor-TOOLS_STRICT",
    "instructor-JSON_SCHEMA",
    "openai-parse-response_format",
    "openai-parse-tools",
    "langchain-json_schema",
    "langchain-function_calling",
    "langchain-function_calling-strict",
]


def _client(mode: str, url: str, http: httpx.Client) -> Ask:
    library, _, rest = mode.partition("-")
    if library == "instructor":
        return _instructor(url, http, instructor.Mode[rest])
    if library == "openai":
        return _openai_parse(url, http, as_tool=rest.endswith("tools"))
    method, _, strict = rest.partition("-")
    return _langchain(url, http, method, True if strict else None)


Outcome = tuple[list[BaseModel | Exception], Recorder]


@pytest.fixture(scope="module")
def outcomes(smol_server) -> dict[str, Outcome]:
    """Every mode's answers to every case, asked concurrently: one engine batch."""
    recorders = {mode: Recorder() for mode in MODES}
    asks = {
        mode: _client(mode, smol_server.url + "/v1", recorders[mode].client()) for mode in MODES
    }

    def answer(job: tuple[str, type[BaseModel], str]) -> BaseModel | Exception:
        mode, model, prompt = job
        try:
            return asks[mode](model, prompt)
        except Exception as e:  # reported by the mode's own test, with the prompt
            return e

    jobs = [(mode, model, prompt) for mode in MODES for model, prompt in CASES]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        answers = list(pool.map(answer, jobs))
    return {
        mode: (answers[k * len(CASES) : (k + 1) * len(CASES)], recorders[mode])
        for k, mode in enumerate(MODES)
    }


@pytest.mark.parametrize("mode", MODES)
def test_every_model_parses_in_every_mode(outcomes: dict[str, Outcome], mode: str) -> None:
    outs, recorder = outcomes[mode]
    for (model, prompt), out in zip(CASES, outs):
        assert isinstance(out, model), (prompt, out)
        check_values(out)
    assert len(recorder.finish_reasons) == len(CASES)  # one attempt each
    assert set(recorder.finish_reasons) <= {"stop", "tool_calls"}, recorder.finish_reasons


def test_nested_tool_parameters_keep_their_refs(smol_server) -> None:
    """A tool whose parameters hold `$defs` / `$ref` (a nested pydantic model) and
    `anyOf: [T, null]`, forced by name: the call's arguments validate against them."""
    client = openai.OpenAI(base_url=smol_server.url + "/v1", api_key="none", max_retries=0)
    tool = {
        "type": "function",
        "function": {"name": "save_profile", "parameters": Profile.model_json_schema()},
    }
    assert "$defs" in tool["function"]["parameters"]
    r = client.chat.completions.create(
        model=MODEL,
        messages=_user("Dana lives in Oslo, Norway."),
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "save_profile"}},
        temperature=0,
        max_tokens=MAX_TOKENS,
    )
    [call] = r.choices[0].message.tool_calls
    profile = Profile.model_validate(json.loads(call.function.arguments))
    assert profile.home is None or isinstance(profile.home, Address)
