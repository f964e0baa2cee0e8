"""RuntimeEndpoint: the Backend protocol over HTTP to a running stemma (or SGLang) server.

Standard library only (urllib). Streaming reads server-sent events `data: {...}` until
`data: [DONE]`. An HTTP error raises BackendError carrying the server's JSON error message.
The chat template is `chat_template_name`'s if given, else the server's own (stemma sends it in
/get_model_info), else the one the model path implies, as SGLang's client picks it.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from .backend import BackendError
from .named_templates import template_by_name, template_name_for_model_path


class RuntimeEndpoint:
    """A Backend that talks to `url` (e.g. "http://localhost:30000")."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        timeout: float | None = None,
        chat_template_name: str | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.chat_template_name = chat_template_name
        if chat_template_name is not None:
            template_by_name(chat_template_name)  # an unknown name fails here, not mid-program
        self._model_info: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def generate(self, req: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
        result: dict[str, Any] | list[dict[str, Any]] = self._post_json(
            "/generate", {**req, "stream": False}
        )
        return result

    def generate_stream(self, req: dict[str, Any]) -> Iterator[dict[str, Any]]:
        with self._open("/generate", {**req, "stream": True}) as response:
            yield from sse_chunks(response, "/generate stream")

    def get_model_info(self) -> dict[str, Any]:
        with self._lock:
            if self._model_info is None:
                self._model_info = self._request("GET", "/get_model_info", None)
            return self._model_info

    def get_chat_template(self) -> dict[str, Any] | None:
        if self.chat_template_name is not None:
            return template_by_name(self.chat_template_name).to_dict()
        info = self.get_model_info()
        if info.get("chat_template"):
            template: dict[str, Any] = info["chat_template"]
            return template
        name = template_name_for_model_path(str(info.get("model_path", "")))
        return template_by_name(name).to_dict()

    def get_model_name(self) -> str:
        """The server's model path (SGLang's RuntimeEndpoint.get_model_name)."""
        return str(self.get_model_info()["model_path"])

    def tokenize(self, text: str) -> list[int]:
        return list(self._post_json("/tokenize", {"prompt": text})["tokens"])

    def flush_cache(self) -> None:
        self._request("POST", "/flush_cache", None, expect_json=False)

    def _post_json(self, path: str, body: dict[str, Any]) -> Any:
        return self._request("POST", path, body)

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None, expect_json: bool = True
    ) -> Any:
        with self._open(path, body, method) as response:
            payload = response.read()
        if not expect_json:
            return None
        return json.loads(payload)

    def _open(self, path: str, body: dict[str, Any] | None, method: str = "POST") -> Any:
        headers = {"Content-Type": "application/json"}
        if self.api_key is not None:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(self.url + path, data, headers, method=method)
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as err:
            message = _error_message(_read_json(err))
            raise BackendError(f"HTTP {err.code} from {path}: {message}", err.code) from None
        except urllib.error.URLError as err:
            raise BackendError(f"cannot reach {self.url}{path}: {err.reason}") from None

    def __repr__(self) -> str:
        return f"RuntimeEndpoint({self.url!r})"


def _read_json(err: urllib.error.HTTPError) -> Any:
    raw = err.read().decode("utf-8", errors="replace")
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw.strip() or err.reason


def sse_chunks(response: Any, what: str) -> Iterator[dict[str, Any]]:
    """The JSON `data:` events of a server-sent-event response, up to `data: [DONE]`; an
    error event raises BackendError naming `what`."""
    for raw in response:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return
        chunk = json.loads(data)
        if "error" in chunk:
            raise BackendError(f"{what} failed: {_error_message(chunk)}")
        yield chunk


def _error_message(body: Any) -> str:
    """The message inside the error bodies servers send: {"error": {"message"}}, {"detail"} ..."""
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            for key in ("message", "detail", "msg"):
                if key in error:
                    return str(error[key])
            return json.dumps(error)
        return str(error)
    return str(body)
