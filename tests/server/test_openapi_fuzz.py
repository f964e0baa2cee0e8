"""Requests generated from the server's own OpenAPI spec (schemathesis, valid and invalid
bodies) never get a 5xx, and the server answers normally afterwards."""

from __future__ import annotations

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error

MODES = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)


def test_the_spec_covers_every_route(short_server):
    spec = httpx.get(f"{short_server.url}/openapi.json").json()
    routes = set(spec["paths"])
    assert {"/generate", "/tokenize", "/v1/chat/completions", "/v1/completions"} <= routes
    chat = spec["components"]["schemas"]["ChatCompletionRequest"]
    assert {"messages", "tools", "response_format", "top_k", "json_schema"} <= set(
        chat["properties"]
    )


def test_no_server_errors_on_generated_requests(short_server):
    schema = schemathesis.openapi.from_url(f"{short_server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    strategy = st.one_of([op.as_strategy(mode) for op in operations for mode in MODES])

    @settings(
        max_examples=150,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def check(case: schemathesis.Case) -> None:
        case.call_and_validate(base_url=short_server.url, checks=[not_a_server_error], timeout=60)

    check()
    ok = httpx.post(
        f"{short_server.url}/generate",
        json={"text": "hi", "sampling_params": {"max_new_tokens": 2}},
    )
    assert ok.status_code == 200
