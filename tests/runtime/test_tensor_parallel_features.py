"""The engine's features under tensor parallelism: streaming, an abort mid-generation,
retraction when the KV pool runs out, and jump-forward through a JSON schema and a regex give
the same ids at tp_size 2 as at tp_size 1 (float64 tiny Llama, 2 KV heads split), with the
memory invariant checked after every step; forged steps are rejected and the store listens on
its address only."""

from __future__ import annotations

import json
import re
import socket
import time
from datetime import timedelta

import jsonschema
import pytest
import torch.distributed as dist
from stemma.bench.tool_schemas import weather_args
from stemma.runtime.engine import Engine
from stemma.runtime.executor.step_message import pack_stop
from stemma.runtime.executor.tp_auth import seal

from ..fixtures import build_tiny_checkpoint

# 160 slots: four 30-token prompts growing by 25 tokens each do not fit at once.
OPTS = dict(dtype="float64", max_total_tokens=160, chunked_prefill_size=64)
GREEDY = {"temperature": 0, "ignore_eos": True}
SCHEMA = weather_args(("city", "unit"), max_city_len=8, closed=True)
REGEX = r'\{"name": "get_weather", "arguments": \{"city": "[a-z]{1,6}"\}\}'


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """(tp_size=1, tp_size=2) engines over one model, each with a 160-slot pool."""
    model = build_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama-features"))
    with Engine(str(model), **OPTS) as tp1, Engine(str(model), tp_size=2, **OPTS) as tp2:
        tp1.check_invariants = tp2.check_invariants = True
        yield tp1, tp2


def both(engines, **request):
    return [engine.generate(**request) for engine in engines]


def test_streaming_chunks_equal_tp1(engines, make_prompts):
    [prompt] = make_prompts([9], 384, 21)
    runs = [
        list(e.generate(input_ids=prompt, sampling_params=GREEDY | {"max_new_tokens": 12},
                        stream=True))
        for e in engines
    ]  # fmt: skip
    # Chunks are cumulative, and a reader that lags gets the newest one (engine_state's
    # EventBuffer), so how many arrive depends on timing; what each holds does not.
    texts = [[chunk["text"] for chunk in run] for run in runs]
    assert texts[1][-1] == texts[0][-1]
    for run_texts in texts:
        assert all(run_texts[-1].startswith(t) for t in run_texts)
    assert runs[1][-1]["output_ids"] == runs[0][-1]["output_ids"]
    assert len(runs[1][-1]["output_ids"]) == 12


def test_abort_mid_generation_then_serve_equal_tp1(engines, make_prompts, step_gate):
    """The abort is sent while rank 0 waits before the second step, so it lands right after
    that step on any CPU: two tokens."""
    tp1, tp2 = engines
    [prompt] = make_prompts([8], 384, 22)
    sp = GREEDY | {"max_new_tokens": 100}
    full = tp1.generate(input_ids=prompt, sampling_params=sp)["output_ids"]
    gate = step_gate(tp2, free=1)  # the prefill: the first token
    stream = tp2.generate(input_ids=prompt, sampling_params=sp, stream=True, rid="tp-abort")
    next(stream)
    assert gate.held.wait(60)  # past the inbox: the abort is seen after the held step
    tp2.abort("tp-abort")
    gate.release()
    *_, last = stream
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    partial = last["output_ids"]
    assert len(partial) == 2 and partial == full[:2]
    assert tp2.get_metrics()["num_running"] == 0
    [after] = make_prompts([11], 384, 23)
    a, b = both(engines, input_ids=after, sampling_params=GREEDY | {"max_new_tokens": 8})
    assert b["output_ids"] == a["output_ids"]


def test_retraction_under_a_tiny_pool_equal_tp1(engines, make_prompts):
    prompts = make_prompts([30, 30, 30, 30], 384, 24)
    for e in engines:
        e.flush_cache()
    before = [e.get_metrics()["num_retractions"] for e in engines]
    a, b = both(engines, input_ids=prompts, sampling_params=GREEDY | {"max_new_tokens": 25})
    after = [e.get_metrics()["num_retractions"] for e in engines]
    assert after[1] > before[1] and after[0] > before[0]
    assert [o["output_ids"] for o in b] == [o["output_ids"] for o in a]
    assert all(len(o["output_ids"]) == 25 for o in b)


@pytest.mark.parametrize("kind", ["json_schema", "regex"])
def test_jump_forward_equal_tp1(engines, kind):
    tp1, tp2 = engines
    constraint = json.dumps(SCHEMA) if kind == "json_schema" else REGEX
    sp = {"temperature": 0, "max_new_tokens": 40, kind: constraint}
    steps = [e.get_metrics()["num_steps"] for e in engines]
    a, b = both(engines, text="Weather in Paris:", sampling_params=sp)
    steps = [e.get_metrics()["num_steps"] - s for e, s in zip(engines, steps)]
    assert b["output_ids"] == a["output_ids"]
    assert b["meta_info"]["finish_reason"]["type"] == "stop"
    if kind == "json_schema":
        jsonschema.validate(json.loads(b["text"]), SCHEMA)
    else:
        assert re.fullmatch(REGEX, b["text"])
    # Forced text rides along as verified drafts: fewer forwards than tokens, on both.
    completion = b["meta_info"]["completion_tokens"]
    assert steps[1] == steps[0] < completion


def _wait_for_count(store: dist.TCPStore, key: str, count: int) -> None:
    """Until the worker has counted `count` rejections (it reads each forged value once)."""
    deadline = time.monotonic() + 30
    while store.add(key, 0) < count:
        assert time.monotonic() < deadline, f"{key} stayed at {store.add(key, 0)}"
        time.sleep(0.01)


def test_forged_steps_are_rejected_and_requests_keep_working(engines, make_prompts):
    tp1, tp2 = engines
    client = dist.TCPStore("127.0.0.1", tp2.tp.store.port, timeout=timedelta(seconds=30))
    key = f"step/{tp2.tp._step + 1}"  # the step rank 1 waits for now
    client.set(key, pack_stop())  # the bare 40-byte STOP anyone who reaches the port could send
    _wait_for_count(client, "rejected/1", 1)
    client.set(key, seal(b"a guess, not the launch secret", key, pack_stop()))
    _wait_for_count(client, "rejected/1", 2)
    [prompt] = make_prompts([12], 384, 25)
    a, b = both(engines, input_ids=prompt, sampling_params=GREEDY | {"max_new_tokens": 8})
    assert b["output_ids"] == a["output_ids"] and len(b["output_ids"]) == 8
    assert tp2.unavailable is None and client.add("rejected/1", 0) == 2
    assert all(p.is_alive() for p in tp2.tp.procs.values())


def test_the_store_listens_on_its_address_only(engines):
    port = engines[1].tp.store.port
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with pytest.raises(ConnectionRefusedError):  # another loopback address, same port
        socket.create_connection(("127.0.0.2", port), timeout=5)
