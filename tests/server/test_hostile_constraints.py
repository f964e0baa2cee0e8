"""One hostile constraint fails its own request with a 4xx JSON error naming the cause, the
limit and the flag, and the server goes on answering: schemas nested deep enough to blow up
outlines-core's regex, string patterns whose automaton explodes, nesting past Python's
parsers. What would exhaust memory if a bound regressed runs in a child process under an
address-space limit, never in the test process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from stemma.runtime.limits import check_schema_bounds

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
MEMORY_LIMIT = 2 << 30  # address space of the child that runs the unbounded-if-broken checks


def nested_arrays(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def nested_objects(depth: int) -> dict[str, Any]:
    """Each level an object with the next level and an optional integer beside it."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        props = {"a": {"type": "array", "items": schema}, "b": {"type": "integer"}}
        schema = {"type": "object", "properties": props}
    return schema


def tools_body(schema: dict[str, Any], choice: Any) -> dict[str, Any]:
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    return {"messages": USER, "max_tokens": 4, "tools": [tool], "tool_choice": choice}


def response_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def sampling(**params: Any) -> dict[str, Any]:
    return {"text": "hi", "sampling_params": {"max_new_tokens": 4, **params}}


DEEP = nested_arrays(18)  # under 500 bytes; outlines-core would build a 16M-character regex
NAMED = {"type": "function", "function": {"name": "f"}}

# Every door a json_schema comes in by, with the depth-18 schema: refused before building.
DEEP_CASES: list[tuple[str, dict[str, Any]]] = [
    ("/generate", sampling(json_schema=DEEP)),
    ("/generate", sampling(json_schema=json.dumps(DEEP))),
    ("/generate", sampling(json_schema=nested_objects(18))),
    (CHAT, {"messages": USER, "max_tokens": 4, "response_format": response_format(DEEP)}),
    (CHAT, tools_body(DEEP, "required")),
    (CHAT, tools_body(DEEP, NAMED)),
    (CHAT, {"messages": USER, "max_tokens": 4, "json_schema": DEEP}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 4, "json_schema": DEEP}),
]


def deep_text(depth: int) -> str:
    return '{"type":"array","items":' * depth + '{"type":"string"}' + "}" * depth


def deep_arguments(depth: int) -> list[dict[str, Any]]:
    args = '{"a":' * depth + "1" + "}" * depth
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}
    return [*USER, {"role": "assistant", "content": None, "tool_calls": [call]}]


# (route, body, status, words the error message must contain)
CASES: list[tuple[str, dict[str, Any], int, str]] = [
    ("/generate", sampling(json_schema=nested_arrays(100)), 400, "--max-schema-depth"),
    ("/generate", sampling(json_schema=deep_text(1200)), 400, "--max-schema-depth"),
    ("/generate", sampling(json_schema=nested_arrays(200)), 400, "--max-schema-depth"),
    (
        CHAT,
        {"messages": USER, "response_format": response_format(nested_arrays(200))},
        400,
        "--max-schema-depth",
    ),
    ("/generate", sampling(json_schema={"type": "string", "maxLength": 1 << 32}), 400, "2^32"),
    # outlines-core would read 2^64 as 0 and silently drop the bound
    ("/generate", sampling(json_schema={"type": "string", "minLength": 1 << 64}), 400, "2^32"),
    (
        CHAT,
        {
            "messages": USER,
            "response_format": response_format({"type": "string", "maxLength": 1 << 32}),
        },
        400,
        "maxLength is 4294967296",
    ),
    (
        "/generate",
        sampling(
            json_schema={"type": "string", "pattern": "a{0,4294967296}"},
            grammar_backend="outlines",  # outlines' own check; llguidance's parser refuses it too
        ),
        400,
        "too large",
    ),
    (CHAT, {"messages": USER, "regex": "(" * 600 + "a" + ")" * 600}, 400, "regex"),
    ("/v1/completions", {"prompt": "hi", "regex": "a{0,4294967296}"}, 400, "too large"),
    ("/generate", sampling(regex="(" * 600 + "a" + ")" * 600), 400, "regex"),
    ("/generate", sampling(regex="a{0,4294967296}"), 400, "regex"),
    (CHAT, {"messages": deep_arguments(3000), "max_tokens": 4}, 400, "nest too deeply"),
    (
        "/generate",
        sampling(
            json_schema={"type": "string", "pattern": '(a|")*a(a|b){3}'},
            grammar_backend="outlines",  # llguidance, the default's route, escapes the quote
        ),
        400,
        "can match '\"'",
    ),
    ("/generate", sampling(json_schema={"type": "string", "pattern": "(a|b)*a(a|b){3}"}), 200, ""),
    ("/generate", sampling(json_schema=nested_arrays(3)), 200, ""),
    (CHAT, tools_body(nested_objects(3), "required"), 200, ""),
]


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def assert_refused(r: httpx.Response, status: int, words: str) -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error["message"]
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(("route", "body"), DEEP_CASES)
def test_a_deep_schema_is_refused_by_its_estimate_at_every_door(server, client, route, body):
    # First the bound itself, in arithmetic: were it gone, the server would build 16M chars.
    with pytest.raises(ValueError, match="--max-schema-regex-chars"):
        check_schema_bounds(DEEP, server.engine.config, "json_schema")
    r = client.post(route, json=body)
    assert_refused(r, 400, "--max-schema-regex-chars")
    assert "upper estimate" in r.json()["error"]["message"]


@pytest.mark.parametrize(("route", "body", "status", "words"), CASES)
def test_hostile_constraint_is_a_4xx_naming_it(client, route, body, status, words):
    r = client.post(route, json=body)
    if status == 200:
        assert r.status_code == 200, r.text
    else:
        assert_refused(r, status, words)
    ok = client.post("/generate", json=sampling())
    assert ok.status_code == 200


@pytest.mark.parametrize("route", ["/generate", CHAT])
def test_a_body_nested_past_the_json_reader_is_a_4xx(client, route):
    """A schema object nested 1200 deep: too deep for the client's json.dumps, so sent as text."""
    if route == CHAT:
        head, tail = '{"messages":[{"role":"user","content":"hi"}],"response_format":', "}"
        schema = (
            '{"type":"json_schema","json_schema":{"name":"x","schema":' + deep_text(1200) + "}}"
        )
    else:
        head, tail = '{"text":"hi","sampling_params":{"json_schema":', "}}"
        schema = deep_text(1200)
    body = head + schema + tail
    r = client.post(route, content=body, headers={"Content-Type": "application/json"})
    assert_refused(r, 400, "error parsing the body")  # FastAPI's reader gives up first


def test_health_answers_alongside_hostile_constraints(client):
    bodies = [body for _, body in DEEP_CASES[:3]] * 4
    with ThreadPoolExecutor(len(bodies) + 1) as pool:
        refused = [pool.submit(client.post, "/generate", json=b) for b in bodies]
        health = pool.submit(client.get, "/health")
        assert health.result().status_code == 200
        assert [f.result().status_code for f in refused] == [400] * len(bodies)


@pytest.mark.parametrize("where", ["server check", "engine parse"])
def test_health_answers_while_a_constraint_is_being_built(server, client, monkeypatch, where):
    """The schema's resolution is held until /health has answered: were it on the event loop,
    /health could not answer and the test would fail at its timeout."""
    import stemma.runtime.constrained.constraints as constraints
    import stemma.runtime.constrained.spec as spec

    # The server resolves the schema itself; the engine's parser checks it through its backend.
    module, name = (spec, "resolve") if where == "server check" else (constraints, "pick_backend")
    entered, gate, original = threading.Event(), threading.Event(), getattr(module, name)

    def held(*args: Any) -> Any:
        if args[0].json_schema is not None:
            entered.set()
            assert gate.wait(10)
        return original(*args)

    monkeypatch.setattr(module, name, held)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(client.post, "/generate", json=sampling(json_schema=nested_arrays(2)))
        assert entered.wait(10)
        assert client.get("/health", timeout=5).status_code == 200
        gate.set()
        assert pending.result().status_code == 200


_CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
from stemma.runtime.config import EngineConfig
from stemma.runtime.constrained.schema_check import schema_issues
from stemma.runtime.limits import check_sampling_bounds
from stemma.runtime.server.errors import APIError
from stemma.runtime.server.native import check_json_schema

schema = {{"type": "string"}}
for _ in range(30):
    schema = {{"type": "array", "items": schema}}
config, answers = EngineConfig(), {{}}
try:
    check_sampling_bounds({{"json_schema": schema}}, config)
except ValueError as e:
    answers["bounds"] = str(e)
try:
    check_json_schema(schema, "json_schema", config)
except APIError as e:
    answers["server"] = [e.status, str(e)]
answers["safe"] = schema_issues({{"type": "string", "pattern": "(a|b)*a(a|b){{26}}"}})
answers["unsafe"] = schema_issues({{"type": "string", "pattern": '(a|")*a(a|b){{26}}'}})
json.dump(answers, sys.stdout)
"""


def test_exploding_schemas_and_patterns_are_judged_in_bounded_memory():
    """Depth 30 would need tens of GB and the pattern a 2^27-state DFA, were they built."""
    code = textwrap.dedent(_CHILD.format(limit=MEMORY_LIMIT))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    answers = json.loads(done.stdout)
    assert "--max-schema-regex-chars" in answers["bounds"]
    assert answers["server"][0] == 400
    assert "--max-schema-regex-chars" in answers["server"][1]
    assert answers["safe"] == []
    assert len(answers["unsafe"]) == 1
    assert "can match" in answers["unsafe"][0]
