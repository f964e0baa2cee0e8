"""Constrained outputs over HTTP under --grammar-backend llguidance: regex and json_schema on
/generate match or validate, and a keyword the backend refuses is a 400 naming it and its
schema path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from stemma.runtime.engine import Engine
from stemma.runtime.server.app import create_app

from .conftest import LiveServer
from .test_constrained import check_regex_and_schema


@pytest.fixture(scope="module")
def ll_server(tiny_llama_dir: Path) -> Iterator[LiveServer]:
    engine = Engine(
        str(tiny_llama_dir), dtype="float32", max_total_tokens=4096, grammar_backend="llguidance"
    )
    live = LiveServer(create_app(engine, served_model_name="tiny"), engine)
    yield live
    live.stop()
    engine.shutdown()


def test_generate_under_llguidance_matches_and_validates(ll_server: LiveServer) -> None:
    # A closed object and an integer bound llguidance honours: the tiny model's output must
    # finish within the budget (every field is short) and validate.
    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer", "minimum": 3}},
        "required": ["answer", "n"],
        "additionalProperties": False,
    }
    check_regex_and_schema(ll_server.url, schema, max_new_tokens=48)


def test_refused_keyword_is_a_400_naming_keyword_and_path(ll_server: LiveServer) -> None:
    schema = {"type": "object", "properties": {"a": {"not": {"pattern": "^x"}}}}
    sp = {"json_schema": json.dumps(schema), "max_new_tokens": 8}
    with httpx.Client(base_url=ll_server.url, timeout=60) as c:
        r = c.post("/generate", json={"text": "JSON:", "sampling_params": sp})
    assert r.status_code == 400
    assert "'not' at #/properties/a" in r.text


def test_chat_response_format_under_llguidance(ll_server: LiveServer) -> None:
    """`minimum` (refused by the outlines pre-check) is honoured; a `not` with no exact
    rewrite is a 400 naming it."""
    ok = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}}}
    bad = {"type": "object", "properties": {"a": {"not": {"pattern": "^x"}}}}
    body = {"model": "tiny", "messages": [{"role": "user", "content": "JSON"}], "max_tokens": 2}
    body |= {"temperature": 0}
    with httpx.Client(base_url=ll_server.url, timeout=60) as c:
        fmt = {"type": "json_schema", "json_schema": {"name": "ok", "schema": ok}}
        r = c.post("/v1/chat/completions", json={**body, "response_format": fmt})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"].startswith("{")
        fmt = {"type": "json_schema", "json_schema": {"name": "bad", "schema": bad}}
        r = c.post("/v1/chat/completions", json={**body, "response_format": fmt})
    assert r.status_code == 400
    assert "'not' at #/properties/a" in r.text


def test_a_request_picks_its_grammar_backend(ll_server: LiveServer) -> None:
    """sampling_params.grammar_backend overrides the engine's for that request only."""
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}}}
    sp = {"json_schema": json.dumps(schema), "max_new_tokens": 2, "temperature": 0}
    with httpx.Client(base_url=ll_server.url, timeout=60) as c:
        r = c.post("/generate", json={"text": "JSON:", "sampling_params": sp})
        assert r.status_code == 200 and r.json()["text"].startswith("{")
        outlines = {**sp, "grammar_backend": "outlines"}
        r = c.post("/generate", json={"text": "JSON:", "sampling_params": outlines})
        assert r.status_code == 400 and "minimum" in r.text and "outlines" in r.text
        bad = {**sp, "grammar_backend": "xgrammar"}
        r = c.post("/generate", json={"text": "JSON:", "sampling_params": bad})
    assert r.status_code == 400
    assert "sampling_params.grammar_backend" in r.text and "llguidance" in r.text
