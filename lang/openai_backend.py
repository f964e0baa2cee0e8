"""OpenAI: the Backend protocol over any OpenAI-compatible chat API (SGLang's `sgl.OpenAI`).

Programs run unchanged against llama.cpp's `llama-server`, vLLM, stemma's own `/v1` or OpenAI:
each gen is one /v1/chat/completions request carrying the program's messages. JSON schemas go
in `response_format`; regexes and select's choices in the server's grammar field (`regex` on
stemma / SGLang, a GBNF `grammar` on llama.cpp; found by probing the server); select without a
grammar field picks by the first token's `top_logprobs`. What the API cannot express (token
ids, text inside an assistant turn before a gen, a regex on llama.cpp) raises ValueError naming
the primitive. Standard library only; thread-safe.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from .backend import BackendError
from .choices import ChoicesSamplingMethod
from .endpoint import _error_message, _read_json, sse_chunks
from .openai_messages import (
    ROLE_MARKERS,
    chat_body,
    choices_fields,
    match_top_logprobs,
    response_dict,
    split_messages,
)

GRAMMAR_DIALECTS = ("auto", "regex", "gbnf", "none")


class OpenAI:
    """A Backend over `base_url` (e.g. "http://127.0.0.1:8080/v1") serving `model`.

    grammar: "auto" probes the server (stemma / SGLang: "regex", llama.cpp: "gbnf", else
    "none"); name one to skip the probe.
    """

    def __init__(
        self,
        model: str,
        base_url: str = "https://api.openai.com/v1",
        api_key: str | None = None,
        grammar: str = "auto",
        timeout: float | None = None,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if grammar not in GRAMMAR_DIALECTS:
            raise ValueError(f"grammar must be one of {GRAMMAR_DIALECTS}, got {grammar!r}")
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self._grammar: str | None = None if grammar == "auto" else grammar
        self._lock = threading.Lock()

    # -- the Backend protocol -----------------------------------------------------------------

    def generate(self, req: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
        if "input_ids" in req:
            raise ValueError("token ids (input_ids) cannot be sent over the OpenAI chat API")
        params = dict(req.get("sampling_params") or {})
        texts = req["text"] if isinstance(req["text"], list) else [req["text"]]
        if params.get("max_new_tokens") == 0:  # a warm-up: the server caches prompts itself
            out = [_empty_response() for _ in texts]
        else:
            out = []
            for text in texts:
                out += self._complete(text, params, req)
        return out if isinstance(req["text"], list) or len(out) > 1 else out[0]

    def generate_stream(self, req: dict[str, Any]) -> Iterator[dict[str, Any]]:
        body = self._body(req["text"], dict(req.get("sampling_params") or {}), req, "gen")
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        start, text, last, choice = time.perf_counter(), "", {}, {}
        with self._open("/chat/completions", body) as response:
            for last in sse_chunks(response, "chat stream"):
                for delta_choice in last.get("choices") or []:
                    choice = delta_choice
                    piece = (delta_choice.get("delta") or {}).get("content") or ""
                    if piece:
                        text += piece
                        yield {"text": text, "meta_info": {"id": last.get("id", "")}}
        yield response_dict(last, choice, text, time.perf_counter() - start)

    def select_choice(
        self, text: str, choices: list[str], method: ChoicesSamplingMethod
    ) -> tuple[str, dict[str, Any]]:
        """select: the server generates greedily under a grammar of the choices, or (without a
        grammar field) the choice its most likely first token begins. `method` cannot apply:
        the API gives no logprobs of prompt tokens."""
        messages = split_messages(text, "select")
        longest = max(len(c) for c in choices)
        body: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": 0}
        grammar = self.grammar()
        if grammar != "none":
            body |= choices_fields(choices, grammar) | {"max_tokens": longest + 1}
            payload = self._post("/chat/completions", body)
            decision = payload["choices"][0]["message"].get("content") or ""
            if decision not in choices:
                raise BackendError(f"select: the server answered {decision!r}, not a choice")
            return decision, {"decision": decision, "choices": choices, "scored_by": "grammar"}
        body |= {"max_tokens": 1, "logprobs": True, "top_logprobs": 20}
        payload = self._post("/chat/completions", body)
        content = (payload["choices"][0].get("logprobs") or {}).get("content") or []
        found = match_top_logprobs(choices, content[0].get("top_logprobs", []) if content else [])
        if found is None:
            raise ValueError(
                "select cannot be expressed on this server: it has no grammar field, and no "
                f"choice of {choices} begins with one of its top first tokens"
            )
        return found[0], {"decision": found[0], "choices": choices, "first_token_logprob": found[1]}

    def get_model_info(self) -> dict[str, Any]:
        return {"model_path": self.model, "chat_template": self.get_chat_template()}

    def get_chat_template(self) -> dict[str, Any]:
        # The server applies the model's own template (and its default system prompt).
        return {"roles": ROLE_MARKERS, "default_system_prompt": None}

    def tokenize(self, text: str) -> list[int]:
        raise ValueError("the OpenAI API has no tokenizer: token ids cannot be expressed")

    def flush_cache(self) -> None:
        if self.grammar() != "regex":
            raise BackendError("this server has no cache flush in its API")
        self._request("POST", self._server_root() + "/flush_cache", None, expect_json=False)

    def grammar(self) -> str:
        """The server's constraint dialect: "regex", "gbnf" or "none" (probed once)."""
        with self._lock:
            if self._grammar is None:
                self._grammar = self._probe_grammar()
            return self._grammar

    # -- requests -----------------------------------------------------------------------------

    def _complete(
        self, text: str, params: dict[str, Any], req: dict[str, Any]
    ) -> list[dict[str, Any]]:
        body = self._body(text, params, req, "gen")
        start = time.perf_counter()
        payload = self._post("/chat/completions", body)
        latency = time.perf_counter() - start
        return [
            response_dict(payload, c, c["message"].get("content") or "", latency)
            for c in payload["choices"]
        ]

    def _body(
        self, text: str, params: dict[str, Any], req: dict[str, Any], primitive: str
    ) -> dict[str, Any]:
        body = chat_body(self.model, split_messages(text, primitive), params, self.grammar())
        if req.get("return_logprob"):
            body["logprobs"] = True
            if req.get("top_logprobs_num"):
                body["top_logprobs"] = req["top_logprobs_num"]
        return body

    def _probe_grammar(self) -> str:
        root = self._server_root()
        for path, dialect in (("/get_model_info", "regex"), ("/props", "gbnf")):
            try:
                self._request("GET", root + path, None)
                return dialect
            except BackendError:
                continue
        return "none"

    def _server_root(self) -> str:
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        return self._request("POST", self.base_url + path, body)

    def _request(
        self, method: str, url: str, body: dict[str, Any] | None, expect_json: bool = True
    ) -> Any:
        with self._open(url, body, method) as response:
            payload = response.read()
        return json.loads(payload) if expect_json else None

    def _open(self, url: str, body: dict[str, Any] | None, method: str = "POST") -> Any:
        if not url.startswith("http"):
            url = self.base_url + url
        headers = {"Content-Type": "application/json"}
        if self.api_key is not None:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(url, data, headers, method=method)
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as err:
            message = _error_message(_read_json(err))
            raise BackendError(f"HTTP {err.code} from {url}: {message}", err.code) from None
        except urllib.error.URLError as err:
            raise BackendError(f"cannot reach {url}: {err.reason}") from None

    def __repr__(self) -> str:
        return f"OpenAI({self.model!r}, base_url={self.base_url!r})"


def _empty_response() -> dict[str, Any]:
    meta = {"id": "", "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}
    meta |= {"finish_reason": {"type": "length", "length": 0}, "e2e_latency": 0.0}
    return {"text": "", "output_ids": [], "meta_info": meta}
