"""RuntimeEndpoint against a stdlib HTTP server that speaks the /generate protocol."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from stemma.lang import BackendError, RuntimeEndpoint, function, gen

TEMPLATE = {"roles": {"user": ["<u>", "</u>"], "assistant": ["<a>", "</a>"]}}


class _Handler(BaseHTTPRequestHandler):
    received: list[tuple[str, dict | None, str | None]] = []

    def log_message(self, *args: object) -> None:
        """Quiet: tests assert on `received`, not on logs."""

    def do_GET(self) -> None:
        self._record(None)
        self._json(200, {"model_path": "fake", "chat_template": TEMPLATE})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length) or b"null")
        self._record(body)
        if self.path == "/tokenize":
            self._json(200, {"tokens": [ord(c) for c in body["prompt"]]})
        elif self.path == "/flush_cache":
            self.send_response(200)
            self.end_headers()
        elif body.get("sampling_params", {}).get("regex") == "(":
            self._json(400, {"error": {"message": "regex '(' does not compile"}})
        elif body.get("stream"):
            self._stream(["He", "Hello", "Hello!"])
        else:
            self._json(200, {"text": "Hi", "output_ids": [1], "meta_info": {"id": "x"}})

    def _record(self, body: dict | None) -> None:
        self.received.append((self.path, body, self.headers.get("Authorization")))

    def _json(self, status: int, payload: object) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, texts: list[str]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for text in texts:
            self.wfile.write(f"data: {json.dumps({'text': text, 'meta_info': {}})}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture
def server() -> Iterator[str]:
    _Handler.received = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_generate_tokenize_model_info_and_flush(server):
    endpoint = RuntimeEndpoint(server, api_key="k")
    assert endpoint.generate({"text": "x", "sampling_params": {}})["text"] == "Hi"
    assert endpoint.tokenize("ab") == [97, 98]
    assert endpoint.get_chat_template() == TEMPLATE
    assert endpoint.get_model_info()["model_path"] == "fake"
    endpoint.flush_cache()
    paths = [path for path, _, _ in _Handler.received]
    assert paths == ["/generate", "/tokenize", "/get_model_info", "/flush_cache"]
    assert {auth for _, _, auth in _Handler.received} == {"Bearer k"}
    assert _Handler.received[0][1] == {"text": "x", "sampling_params": {}, "stream": False}


def test_stream_yields_cumulative_chunks_until_done(server):
    chunks = list(RuntimeEndpoint(server).generate_stream({"text": "x"}))
    assert [c["text"] for c in chunks] == ["He", "Hello", "Hello!"]


def test_http_errors_carry_the_servers_message(server):
    with pytest.raises(BackendError, match="HTTP 400 from /generate: regex '\\(' does not compile"):
        RuntimeEndpoint(server).generate({"text": "x", "sampling_params": {"regex": "("}})


def test_a_program_over_http_with_the_servers_template(server):
    @function
    def chat(s):
        s.user("hi")
        with s.assistant():
            s += gen("reply", max_tokens=4)

    state = chat.run(backend=RuntimeEndpoint(server))
    assert state.text() == "<u>hi</u><a>Hi</a>"
    streamed = chat.run(backend=RuntimeEndpoint(server), stream=True)
    assert "".join(streamed.text_iter()) == "<u>hi</u><a>Hello!</a>"


def test_a_failed_http_request_fails_the_program(server):
    @function
    def prog(s):
        s += "x" + gen("y", regex="(")

    with pytest.raises(BackendError, match="does not compile") as info:
        prog.run(backend=RuntimeEndpoint(server))["y"]
    assert info.value.status == 400


def test_unreachable_server_and_bad_url():
    with pytest.raises(BackendError, match="cannot reach"):
        RuntimeEndpoint("http://127.0.0.1:9", timeout=2).tokenize("x")
    with pytest.raises(ValueError, match="localhost:1"):
        RuntimeEndpoint("localhost:1")
