"""The API key (401 without it) and the request body limit (413), on the guarded server."""

from __future__ import annotations

import httpx
import openai
import pytest

BODY = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}


@pytest.fixture()
def anonymous(guarded_server):
    with httpx.Client(base_url=guarded_server.url, timeout=60) as c:
        yield c


@pytest.fixture()
def authorized(guarded_server):
    headers = {"Authorization": f"Bearer {guarded_server.api_key}"}
    with httpx.Client(base_url=guarded_server.url, timeout=60, headers=headers) as c:
        yield c


def test_requests_without_the_key_are_401(anonymous):
    for method, route in [
        ("POST", "/generate"),
        ("GET", "/v1/models"),
        ("GET", "/metrics"),
        ("POST", "/flush_cache"),
        ("GET", "/get_model_info"),
    ]:
        r = anonymous.request(method, route, json=BODY)
        assert r.status_code == 401
        assert "API key" in r.json()["error"]["message"]
    wrong = anonymous.post("/generate", json=BODY, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "invalid" in wrong.json()["error"]["message"]
    assert anonymous.get("/health").status_code == 200


def test_the_key_opens_every_route(authorized, guarded_server):
    assert authorized.post("/generate", json=BODY).status_code == 200
    key = guarded_server.api_key
    with openai.OpenAI(base_url=f"{guarded_server.url}/v1", api_key=key) as client:
        assert client.models.list().data[0].id == guarded_server.engine.config.model
    with openai.OpenAI(base_url=f"{guarded_server.url}/v1", api_key="wrong") as client:
        with pytest.raises(openai.AuthenticationError):
            client.models.list()


def test_a_body_over_the_limit_is_413_then_serving_goes_on(authorized, guarded_server):
    r = authorized.post("/generate", json={"text": "x" * (guarded_server.max_request_bytes + 1)})
    assert r.status_code == 413
    assert "limit" in r.json()["error"]["message"]
    pieces = [b'{"text": "', b"x" * guarded_server.max_request_bytes, b'"}']
    chunked = authorized.post("/generate", content=iter(pieces))  # no Content-Length
    assert chunked.status_code == 413
    assert "limit" in chunked.json()["error"]["message"]
    assert authorized.post("/generate", json=BODY).status_code == 200
