"""tp_size=2 on CPU (gloo): greedy ids equal HF transformers and tp_size=1 (float64 tiny models:
Llama with 2 KV heads split, Qwen2 with biases and a tied, vocab-parallel embedding, Llama with
1 KV head replicated), for a batch with chunked prefill, a cache hit, a constraint and
logprobs; a killed or stopped worker fails requests naming its rank; no process outlives the
engine."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from stemma.runtime.engine import Engine, EngineUnavailable
from stemma.runtime.server.app import create_app

from ..fixtures import build_tiny_checkpoint

N = 6
GREEDY = {"max_new_tokens": N, "temperature": 0, "ignore_eos": True}
OPTS = dict(dtype="float64", max_total_tokens=1024, chunked_prefill_size=16)


@pytest.fixture(scope="module", params=["llama-kv2", "qwen2-kv2", "llama-kv1"])
def model_dir(request, tmp_path_factory) -> Path:
    arch, kv = request.param.split("-kv")
    out = tmp_path_factory.mktemp(request.param)
    config_name = {"llama": "LlamaConfig", "qwen2": "Qwen2Config"}[arch]
    tie = arch == "qwen2"
    return build_tiny_checkpoint(
        out, config_name, tie_word_embeddings=tie, num_key_value_heads=int(kv)
    )


@pytest.fixture(scope="module")
def engines(model_dir):
    """(tp_size=1, tp_size=2) engines over one model."""
    with Engine(str(model_dir), **OPTS) as tp1, Engine(str(model_dir), tp_size=2, **OPTS) as tp2:
        tp2.check_invariants = True
        yield tp1, tp2
    assert all(_gone(pid) for pid in tp2.tp.pids.values())  # shutdown leaves no process


def test_batch_with_chunked_prefill_and_cache_hit_match_hf(
    engines, model_dir, hf_ref, make_prompts
):
    _, tp2 = engines
    prompts = make_prompts([5, 40, 2, 17], 384, 3)  # 40 tokens: three chunks of 16
    outs = tp2.generate(input_ids=prompts, sampling_params=GREEDY)
    assert [o["output_ids"] for o in outs] == [hf_ref.greedy(model_dir, p, N) for p in prompts]
    longer = prompts[1] + [7, 8, 9]
    again = tp2.generate(input_ids=longer, sampling_params=GREEDY)
    assert again["meta_info"]["cached_tokens"] >= 40
    assert again["output_ids"] == hf_ref.greedy(model_dir, longer, N)


def test_constrained_and_logprobs_equal_tp1(engines, model_dir, hf_ref, make_prompts):
    tp1, tp2 = engines
    [prompt] = make_prompts([12], 384, 4)
    pattern = r"[0-9]{2}-(ab|cd)[a-z]{1,3}"
    req = dict(
        input_ids=prompt,
        sampling_params={"max_new_tokens": 12, "temperature": 0, "regex": pattern},
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=2,
    )
    a, b = tp1.generate(**req), tp2.generate(**req)
    assert re.fullmatch(pattern, b["text"])
    assert b["output_ids"] == a["output_ids"]
    lp1, lp2 = a["meta_info"], b["meta_info"]
    assert [t[1] for t in lp2["output_top_logprobs"][0]] == [
        t[1] for t in lp1["output_top_logprobs"][0]
    ]
    got = [t[0] for t in lp2["input_token_logprobs"][1:]]
    assert got == pytest.approx(hf_ref.prompt_logprobs(model_dir, prompt), abs=1e-9)
    out1 = [t[0] for t in lp1["output_token_logprobs"]]
    assert [t[0] for t in lp2["output_token_logprobs"]] == pytest.approx(out1, abs=1e-9)


def test_tp_size_that_does_not_divide_the_heads_is_an_error(tiny_llama_dir):
    with pytest.raises(ValueError, match="tp_size=3 does not divide num_attention_heads=4"):
        Engine(str(tiny_llama_dir), tp_size=3, **OPTS)


def _gone(pid: int) -> bool:
    """No such process, or only its zombie (exited, not yet reaped by its new parent)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_lost_worker_fails_requests_naming_its_rank(tiny_llama_dir, make_prompts, step_gate, how):
    """Rank 0 is held after the prefill, so the step after the kill (or stop) is the second
    one, whatever this CPU's speed: it finds rank 1 gone and the request ends with the first
    token only."""
    engine = Engine(str(tiny_llama_dir), tp_size=2, dist_timeout_s=2.0, **OPTS)
    [pid] = engine.tp.pids.values()
    try:
        [prompt] = make_prompts([8], 384, 5)
        gate = step_gate(engine, free=1)  # the prefill: the first token
        stream = engine.generate(
            input_ids=prompt, sampling_params={"max_new_tokens": 480, "ignore_eos": True},
            stream=True,
        )  # fmt: skip
        next(stream)
        os.kill(pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        gate.release()
        start = time.monotonic()
        *_, last = stream
        assert time.monotonic() - start < 10  # a hang's bound: stop waits dist_timeout_s
        reason = last["meta_info"]["finish_reason"]
        assert reason["type"] == "abort"
        assert len(last["output_ids"]) == 1
        assert ("rank 1 died" if how == "kill" else "rank 1 hung") in reason["message"]
        with pytest.raises(EngineUnavailable, match="rank 1"):
            engine.generate(input_ids=prompt, sampling_params=GREEDY)
        client = TestClient(create_app(engine))  # the server stays up and says why
        assert client.get("/health").status_code == 503
        refused = client.post("/generate", json={"input_ids": prompt})
        assert refused.status_code == 503 and "rank 1" in refused.json()["error"]["message"]
    finally:
        engine.shutdown()
    assert _gone(pid)


def test_workers_exit_when_the_engine_process_is_killed(tiny_llama_dir, tmp_path):
    path = tmp_path / "engine_proc.py"
    path.write_text(
        "import time\n"
        "from stemma.runtime.engine import Engine\n"
        "if __name__ == '__main__':\n"
        f"    e = Engine({str(tiny_llama_dir)!r}, tp_size=2, dtype='float64',\n"
        "               max_total_tokens=256)\n"
        "    print(*e.tp.pids.values(), flush=True)\n"
        "    time.sleep(60)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pid = int(proc.stdout.readline())
        proc.kill()
        deadline = time.monotonic() + 5
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(pid), f"worker {pid} outlived its engine's process"
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_smollm2_tp3_equals_tp1():
    """SmolLM2-135M has 9 query and 3 KV heads: tp_size 3 divides it, 2 does not."""
    prompts = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,",
               "Water boils at", "The best way to learn"]  # fmt: skip
    sp = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    outs = []
    for tp in (1, 3):
        with Engine("smollm2-135m", dtype="float32", tp_size=tp, max_total_tokens=2048) as e:
            outs.append([o["output_ids"] for o in e.generate(prompts, sp)])
    assert outs[0] == outs[1]
    with pytest.raises(ValueError, match="num_attention_heads=9"):
        Engine("smollm2-135m", dtype="float32", tp_size=2)
