"""/generate accepts the rest of SGLang's GenerateReqInput (what sglang-router forwards) when
those fields ask for nothing, and answers 400 naming a field that asks for more."""

from __future__ import annotations

import httpx
import pytest

# What sglang-router 0.3.x adds to a forwarded /generate body, at SGLang's defaults.
ROUTER_FIELDS = {
    "model": "default",
    "log_metrics": True,
    "return_hidden_states": False,
    "background": False,
    "no_logs": False,
    "return_bytes": False,
    "return_entropy": False,
    "lora_path": None,
    "data_parallel_rank": None,
    "custom_labels": None,
    "bootstrap_host": None,
}


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def test_router_fields_at_defaults_are_accepted(client, server):
    sp = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
    r = client.post(
        "/generate", json={"text": "def add(a, b):", "sampling_params": sp, **ROUTER_FIELDS}
    )
    assert r.status_code == 200, r.text
    assert r.json()["output_ids"] == server.engine.generate("def add(a, b):", sp)["output_ids"]


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("return_hidden_states", True, "hidden states"),
        ("image_data", "http://x/cat.png", "images"),
        ("lora_path", "adapter", "LoRA"),
        ("data_parallel_rank", 1, "router"),
        ("not_an_sglang_field", 1, "unknown field"),
    ],
)
def test_fields_asking_for_more_are_400_naming_them(client, field, value, words):
    r = client.post("/generate", json={"text": "x", field: value})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == field and words in error["message"]
