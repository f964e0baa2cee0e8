"""stemma.OpenAI against llama.cpp's server (the xllamacpp wheel) on the built-in GGUF: roles,
select through a GBNF grammar, JSON through response_format. Skips without xllamacpp."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator

import jsonschema
import pytest
import stemma
from stemma import assistant, function, gen, select, user
from stemma.bench.anchors import LLAMA_SERVER, builtin_gguf, wait_healthy
from stemma.examples import multi_turn_chat, tool_call_agent

pytest.importorskip("xllamacpp", reason="no llama.cpp server: pip install xllamacpp")


@pytest.fixture(scope="module")
def llama_url() -> Iterator[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-c", LLAMA_SERVER, str(builtin_gguf()), str(port), "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy("llama.cpp", proc, url, timeout_s=120)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def test_programs_run_on_llama_cpp(llama_url):
    backend = stemma.OpenAI("smollm2-135m", base_url=llama_url + "/v1")
    assert backend.grammar() == "gbnf"

    @function
    def yes_no(s):
        s += user("Is water wet? Answer yes or no.")
        s += assistant(select("answer", choices=["yes", "no", "maybe not"]))

    assert yes_no.run(backend=backend)["answer"] in ("yes", "no", "maybe not")
    messages = multi_turn_chat.run_example(backend, max_tokens=6)
    assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * 4
    result = tool_call_agent.run_example(backend)
    jsonschema.validate(result["call"], tool_call_agent.CALL_SCHEMA)


def test_a_regex_is_refused_naming_it(llama_url):
    backend = stemma.OpenAI("smollm2-135m", base_url=llama_url + "/v1")

    @function
    def number(s):
        s += user("A number?")
        s += assistant(gen("n", regex=r"[0-9]+", max_tokens=4))

    with pytest.raises(ValueError, match=r"gen\(regex=...\).*GBNF"):
        number.run(backend=backend).sync()
    assert json.loads(json.dumps(backend.get_chat_template()))["default_system_prompt"] is None
