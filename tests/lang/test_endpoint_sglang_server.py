"""stemma's RuntimeEndpoint against a stand-in for a real SGLang server: every request body is
checked by SGLang's own code (its /generate JSON contract, its pydantic /tokenize model) and
every /tokenize answer is built with SGLang's response model. The model is scripted: one token
per character, a fixed reply, and choice logprobs from a table. Covered: gen, select, fork,
streaming, and the chat template chosen from the model path when the server sends none.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from stemma.lang import RuntimeEndpoint, assistant, function, gen, select, user

pytest.importorskip("sglang", reason="install with: pip install --no-deps sglang==0.5.23")
uvicorn = pytest.importorskip("uvicorn")
fastapi = pytest.importorskip("fastapi")

REPLY = "Paris"
# The logprob of every token of a choice; "no" scores best.
CHOICE_LOGPROBS = {"yes": -2.0, "no": -0.1, "maybe": -3.0}


class FakeSGLang:
    """A FastAPI app answering like SGLang's server, recording the bodies it accepted."""

    def __init__(self, model_path: str) -> None:
        from sglang.srt.entrypoints.api_contract import generate_contract_error
        from sglang.srt.entrypoints.openai.protocol import TokenizeRequest, TokenizeResponse

        self.model_path = model_path
        self.bodies: list[tuple[str, dict[str, Any]]] = []
        app = fastapi.FastAPI()

        @app.get("/get_model_info")
        def model_info() -> dict[str, Any]:  # SGLang's fields: no chat template among them
            return {"model_path": model_path, "tokenizer_path": model_path, "is_generation": True}

        @app.post("/tokenize")
        async def tokenize(request: fastapi.Request) -> Any:
            try:
                body = TokenizeRequest.model_validate(await request.json())
            except ValueError as e:  # pydantic's ValidationError
                return fastapi.responses.JSONResponse({"error": {"message": str(e)}}, 400)
            self.bodies.append(("/tokenize", body.model_dump(exclude_none=True)))
            assert isinstance(body.prompt, str)
            tokens = [ord(c) for c in body.prompt]
            return TokenizeResponse(
                tokens=tokens, count=len(tokens), max_model_len=4096
            ).model_dump()

        @app.post("/generate")
        async def generate(request: fastapi.Request) -> Any:
            body = await request.json()
            error = generate_contract_error(body)
            if error is not None:
                return fastapi.responses.JSONResponse({"error": {"message": error}}, 400)
            self.bodies.append(("/generate", body))
            if body.get("stream"):
                return fastapi.responses.StreamingResponse(
                    self._events(body), media_type="text/event-stream"
                )
            return self._answer(body)

        self.app = app

    def _answer(self, body: dict[str, Any]) -> Any:
        key = "text" if "text" in body else "input_ids"
        is_batch = isinstance(body[key], list) and (key == "text" or isinstance(body[key][0], list))
        prompts = body[key] if is_batch else [body[key]]
        params = body.get("sampling_params") or {}
        out = [self._one(p, params, body) for p in prompts]
        return out if is_batch else out[0]

    def _one(self, prompt: Any, params: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        ids = [ord(c) for c in prompt] if isinstance(prompt, str) else prompt
        text = "" if params.get("max_new_tokens") == 0 else REPLY
        meta: dict[str, Any] = {
            "id": "fake",
            "prompt_tokens": len(ids),
            "completion_tokens": len(text),
            "cached_tokens": 0,
            "finish_reason": {"type": "stop", "matched": None},
        }
        if body.get("return_logprob"):
            start = body.get("logprob_start_len", -1)
            scored = ids[start:] if start >= 0 else []
            choice = "".join(chr(i) for i in scored)
            lp = CHOICE_LOGPROBS.get(choice, -1.0)
            meta["input_token_logprobs"] = [[lp, i, chr(i)] for i in scored]
            meta["output_token_logprobs"] = []
        return {"text": text, "output_ids": [ord(c) for c in text], "meta_info": meta}

    def _events(self, body: dict[str, Any]) -> Iterator[bytes]:
        final = self._one(body["text"], body.get("sampling_params") or {}, body)
        for end in range(1, len(REPLY)):
            chunk = {**final, "text": REPLY[:end], "meta_info": {"id": "fake"}}
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        yield f"data: {json.dumps(final)}\n\n".encode()
        yield b"data: [DONE]\n\n"


def serve(app: Any) -> tuple[str, Any]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server


@pytest.fixture(scope="module")
def qwen() -> Iterator[tuple[FakeSGLang, str]]:
    fake = FakeSGLang("Qwen/Qwen2.5-0.5B-Instruct")
    url, server = serve(fake.app)
    yield fake, url
    server.should_exit = True


QWEN_SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"


def test_gen_select_and_chat_template_by_model_path(qwen):
    fake, url = qwen

    @function
    def qa(s):
        s += user("Capital of France?")
        s += assistant(gen("answer", max_tokens=8))
        s += user("Sure?")
        s += assistant(select("sure", choices=["yes", "no", "maybe"]))

    state = qa.run(backend=RuntimeEndpoint(url), temperature=0)
    assert state["answer"] == REPLY and state["sure"] == "no"
    assert state.text() == (
        QWEN_SYSTEM
        + "<|im_start|>user\nCapital of France?<|im_end|>\n"
        + f"<|im_start|>assistant\n{REPLY}<|im_end|>\n"
        + "<|im_start|>user\nSure?<|im_end|>\n"
        + "<|im_start|>assistant\nno<|im_end|>\n"
    )
    tokenized = [body for path, body in fake.bodies if path == "/tokenize"]
    assert tokenized and all("prompt" in body for body in tokenized)


def test_fork_and_stream(qwen):
    fake, url = qwen

    @function
    def fan(s):
        s += "Cities:"
        forks = s.fork(2)
        forks += gen("city", max_tokens=4)
        forks.join()

    before = len(fake.bodies)
    assert fan.run(backend=RuntimeEndpoint(url))["city"] == [REPLY, REPLY]
    warm = [b for _, b in fake.bodies[before:] if b.get("sampling_params") == {"max_new_tokens": 0}]
    assert warm and warm[0]["text"] == "Cities:"

    @function
    def streamed(s):
        s += "Q:" + gen("answer", max_tokens=8)

    state = streamed.run(backend=RuntimeEndpoint(url), stream=True)
    assert "".join(state.text_iter("answer")) == REPLY


@pytest.mark.parametrize(
    ("model_path", "name", "start"),
    [
        ("meta-llama/Meta-Llama-3-8B-Instruct", None, "<|start_header_id|>user<|end_header_id|>"),
        ("some/unknown-model", None, "USER:"),
        ("some/unknown-model", "chatml", "<|im_start|>user\n"),
    ],
)
def test_template_by_path_or_name(model_path, name, start):
    fake = FakeSGLang(model_path)
    url, server = serve(fake.app)
    try:

        @function
        def hello(s):
            s += user("hi")

        state = hello.run(backend=RuntimeEndpoint(url, chat_template_name=name))
        assert state.text().startswith(start)
    finally:
        server.should_exit = True


def test_unknown_template_name_fails_at_once():
    with pytest.raises(ValueError, match="unknown chat template 'nope'"):
        RuntimeEndpoint("http://127.0.0.1:9", chat_template_name="nope")


def test_sglang_refuses_what_stemma_used_to_send():
    """SGLang's models are strict where it matters: a /tokenize body of {"text"} is a 400."""
    from sglang.srt.entrypoints.openai.protocol import TokenizeRequest

    with pytest.raises(ValueError, match="Exactly one of 'prompt' or 'messages'"):
        TokenizeRequest.model_validate({"text": "x"})
