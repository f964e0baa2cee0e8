"""Keys and hosts: the admin key (and only it) opens /flush_cache, abort_all and /debug/*; an
API key without an admin key closes them to everyone; any bearer token, non-ASCII included,
is a 401 JSON error when wrong; on a loopback bind a foreign Host header is a 400."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest
from httpx import Response
from stemma.runtime.engine import Engine
from stemma.runtime.server.app import create_app

from .conftest import LiveServer

USER, ADMIN = "user-key", "admin-key"
BODY = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}
EXPECTED_FOR_ADMIN = {  # inject_fault passes the key check, then finds fault injection off
    "/flush_cache": 200,
    "/abort_request": 200,
    "/debug/memory": 200,
    "/debug/inject_fault": 404,
}
ADMIN_ROUTES = [
    ("POST", "/flush_cache", None),
    ("POST", "/abort_request", {"abort_all": True}),
    ("GET", "/debug/memory", None),
    ("POST", "/debug/inject_fault", {"kind": "forward_error"}),
]


@pytest.fixture(scope="module")
def admin_server(tiny_engine: Engine) -> Iterator[LiveServer]:
    """An API key, an admin key, and a loopback bind."""
    app = create_app(tiny_engine, api_key=USER, admin_api_key=ADMIN, host="127.0.0.1")
    live = LiveServer(app, tiny_engine)
    yield live
    live.stop()


def call(url: str, method: str, route: str, body: object, key: bytes | str | None) -> Response:
    headers = {} if key is None else {"Authorization": b"Bearer " + _bytes(key)}
    return httpx.request(method, url + route, json=body, headers=headers, timeout=60)


def _bytes(key: bytes | str) -> bytes:
    return key if isinstance(key, bytes) else key.encode()


@pytest.mark.parametrize("method, route, body", ADMIN_ROUTES)
def test_admin_routes_need_the_admin_key(admin_server, idle_metrics, method, route, body):
    idle_metrics(admin_server.engine)
    anonymous = call(admin_server.url, method, route, body, None)
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "invalid_api_key"
    user = call(admin_server.url, method, route, body, USER)
    assert user.status_code == 403
    error = user.json()["error"]
    assert error["message"] == f"{route} needs the admin key"
    assert error["code"] == "admin_key_required"
    admin = call(admin_server.url, method, route, body, ADMIN)
    assert admin.status_code == EXPECTED_FOR_ADMIN[route]


def test_the_admin_key_opens_the_ordinary_routes_too(admin_server):
    assert call(admin_server.url, "POST", "/generate", BODY, ADMIN).status_code == 200
    assert call(admin_server.url, "POST", "/generate", BODY, USER).status_code == 200
    one = call(admin_server.url, "POST", "/abort_request", {"rid": "nobody"}, USER)
    assert one.status_code == 200 and one.json()["aborted"] == ["nobody"]


def test_an_api_key_without_an_admin_key_closes_the_admin_routes(guarded_server, idle_metrics):
    idle_metrics(guarded_server.engine)
    for method, route, body in ADMIN_ROUTES:
        r = call(guarded_server.url, method, route, body, guarded_server.api_key)
        assert r.status_code == 403, route
        assert "start it with --admin-api-key" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "token",
    ["ключ".encode(), "clé-admin".encode("latin-1"), b"\xff\xfe", "user-key\u00e9".encode()],
)
def test_a_non_ascii_bearer_token_is_401_json(admin_server, guarded_server, token):
    for live in (admin_server, guarded_server):
        r = call(live.url, "POST", "/generate", BODY, token)
        assert r.status_code == 401
        assert r.json()["error"]["message"].startswith("invalid API key")
    assert call(admin_server.url, "POST", "/generate", BODY, USER).status_code == 200


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost:30000", "LOCALHOST", "[::1]:8080"])
def test_a_loopback_bind_answers_loopback_host_names(admin_server, host):
    r = httpx.get(f"{admin_server.url}/health", headers={"Host": host})
    assert r.status_code == 200 and r.json() == {"status": "ok"}


@pytest.mark.parametrize(
    "host",
    [
        "attacker.example",  # DNS rebinding: the attacker's name, resolved to 127.0.0.1
        "attacker.example:30000",
        "127.0.0.1.attacker.example",
        "127.0.0.2",
    ],
)
def test_a_loopback_bind_refuses_other_host_names(admin_server, server, host):
    r = httpx.post(f"{admin_server.url}/generate", json=BODY, headers={"Host": host})
    assert r.status_code == 400 and r.json()["error"]["param"] == "host"
    assert f"Host header {host!r} is not a loopback name" in r.json()["error"]["message"]
    # create_app without `host` (the tests' default server) checks no Host header
    assert httpx.get(f"{server.url}/health", headers={"Host": host}).status_code == 200


def test_a_request_without_a_host_header_is_400_on_a_loopback_bind(admin_server):
    port = int(admin_server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"GET /health HTTP/1.0\r\n\r\n")  # HTTP/1.0 needs no Host
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and json.loads(body)["error"]["param"] == "host"
