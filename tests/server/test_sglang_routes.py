"""SGLang's native routes and field forms on stemma's server: /tokenize with prompt or
messages (also /v1/tokenize), /detokenize, /get_load, PUT /generate, logprob options given
per batch item, and SGLang's `model_path` / `--model-path` names."""

from __future__ import annotations

import httpx
import pytest
from stemma.runtime.server.app import build_parser


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.mark.parametrize("route", ["/tokenize", "/v1/tokenize"])
def test_tokenize_takes_sglang_prompt_forms(client, server, route):
    engine = server.engine
    one = client.post(route, json={"prompt": "The quick", "model": "tiny"}).json()
    assert one["tokens"] == engine.tokenize("The quick") and one["count"] == len(one["tokens"])
    assert one["max_model_len"] == 512
    many = client.post(route, json={"prompt": ["The", "quick brown"]}).json()
    assert many["tokens"] == [engine.tokenize("The"), engine.tokenize("quick brown")]
    assert many["count"] == [len(t) for t in many["tokens"]]
    messages = [{"role": "user", "content": "hi"}]
    chat = client.post(route, json={"messages": messages}).json()
    assert chat["tokens"] == engine.tokenize(engine.apply_chat_template(messages))
    both = client.post(route, json={"prompt": "a", "messages": messages})
    assert both.status_code == 400 and "exactly one" in both.text


def test_detokenize_inverts_tokenize(client, server):
    ids = server.engine.tokenize("The quick brown fox")
    assert client.post("/detokenize", json={"tokens": ids}).json() == {
        "text": "The quick brown fox"
    }
    batch = client.post("/v1/detokenize", json={"tokens": [ids, ids[:1]]}).json()
    assert batch["text"] == ["The quick brown fox", server.engine.tokenizer.decode(ids[:1])]
    bad = client.post("/detokenize", json={"tokens": [10**6]})
    assert bad.status_code == 400 and "vocabulary" in bad.text


def test_get_load_reports_one_rank(client):
    [load] = client.get("/get_load").json()
    assert set(load) == {"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"}
    assert load["dp_rank"] == 0 and load["num_reqs"] >= load["num_waiting_reqs"] >= 0


def test_put_generate_is_post_generate(client):
    body = {"text": "The quick", "sampling_params": {"max_new_tokens": 3, "temperature": 0}}
    put, post = client.put("/generate", json=body).json(), client.post("/generate", json=body)
    assert put["text"] == post.json()["text"]


def test_logprob_options_per_batch_item(client, server):
    ids = [server.engine.tokenize(t) for t in ("The quick brown", "What is the capital")]
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 2, "temperature": 0},
        "return_logprob": [True, False],
        "logprob_start_len": [1, -1],
        "top_logprobs_num": [2, 0],
    }
    first, second = client.post("/generate", json=body).json()
    assert len(first["meta_info"]["input_token_logprobs"]) == len(ids[0]) - 1
    assert len(first["meta_info"]["output_top_logprobs"][0]) == 2
    assert "input_token_logprobs" not in second["meta_info"]
    short = client.post("/generate", json={**body, "return_logprob": [True]})
    assert short.status_code == 400 and "return_logprob" in short.text


def test_model_path_names_the_model(tiny_llama_dir):
    from stemma.runtime.engine import Engine

    assert build_parser().parse_args(["--model-path", "m"]).model == "m"
    with pytest.raises(ValueError, match="give one"):
        Engine("a", model_path="b")
    with Engine(model_path=str(tiny_llama_dir), dtype="float32", kv_cache_mb=8) as engine:
        assert engine.get_model_info()["model_path"] == str(tiny_llama_dir)
