"""stemma's own HTTP backend (lang.RuntimeEndpoint) runs programs against the live server and
gets exactly what the same program gets from the engine in-process."""

from __future__ import annotations

import pytest
from stemma.lang import BackendError, RuntimeEndpoint, function, gen, select
from stemma.runtime.inprocess import Runtime


@function
def triage(s, question):
    s.system("Answer briefly.")
    s.user(question)
    with s.assistant():
        s += gen("answer", max_tokens=6, temperature=0, ignore_eos=True)
    s += "\nVerdict: " + select("verdict", choices=["yes", "no", "maybe"])
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"\nIdea {i}: " + gen("idea", max_tokens=4, temperature=0, ignore_eos=True)
    s["ideas"] = [f["idea"] for f in forks]


def test_a_program_over_http_equals_in_process(server):
    over_http = triage.run("Is Paris in France?", backend=RuntimeEndpoint(server.url))
    over_http.sync()  # one program at a time: the same batches, so the same greedy text
    in_process = triage.run("Is Paris in France?", backend=Runtime(engine=server.engine))
    assert over_http.text() == in_process.text()
    assert over_http["answer"] == in_process["answer"]
    assert over_http["verdict"] == in_process["verdict"] in ("yes", "no", "maybe")
    assert over_http["ideas"] == in_process["ideas"]
    assert over_http.text().startswith("<|im_start|>system\nAnswer briefly.<|im_end|>")


def test_streaming_program_and_endpoint_calls(server):
    endpoint = RuntimeEndpoint(server.url)

    @function
    def short(s):
        s += "The quick brown" + gen("tail", max_tokens=8, temperature=0, ignore_eos=True)

    streamed = short.run(backend=endpoint, stream=True)
    assert "".join(streamed.text_iter()) == short.run(backend=endpoint).text()
    assert endpoint.tokenize("The quick") == server.engine.tokenize("The quick")
    assert endpoint.get_chat_template() == server.engine.get_model_info()["chat_template"]
    endpoint.flush_cache()


def test_endpoint_with_api_key_and_the_servers_errors(guarded_server):
    RuntimeEndpoint(guarded_server.url, api_key=guarded_server.api_key).tokenize("x")
    with pytest.raises(BackendError, match="HTTP 401") as info:
        RuntimeEndpoint(guarded_server.url).tokenize("x")
    assert info.value.status == 401
    endpoint = RuntimeEndpoint(guarded_server.url, api_key=guarded_server.api_key)
    with pytest.raises(BackendError, match="temperature"):
        endpoint.generate({"text": "x", "sampling_params": {"temperature": -2}})
