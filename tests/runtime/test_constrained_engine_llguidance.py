"""The engine decoding under the llguidance backend on the built-in model: every output
validates against its schema (greedy, jump-forward drafts verified by the model), and a
refused keyword is a ValueError at submission naming its schema path."""

from __future__ import annotations

import json

import jsonschema
import pytest
from stemma.bench.tool_schemas import weather_args
from stemma.runtime.engine import Engine

SCHEMAS = [
    weather_args(("city", "days"), max_city_len=12, closed=True, days={"enum": [1, 2, 3]}),
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
    {
        "$defs": {"unit": {"enum": ["celsius", "fahrenheit"]}},
        "type": "object",
        "properties": {"unit": {"$ref": "#/$defs/unit"}, "ok": {"type": "boolean"}},
        "required": ["unit", "ok"],
        "additionalProperties": False,
    },
]


@pytest.fixture(scope="module")
def engine():
    e = Engine("smollm2-135m", kv_cache_mb=128, grammar_backend="llguidance")
    e.check_invariants = True
    yield e
    e.shutdown()


def _requests(engine: Engine) -> tuple[list[str], list[dict]]:
    texts = [
        engine.apply_chat_template([{"role": "user", "content": f"JSON for {json.dumps(s)}"}])
        for s in SCHEMAS
    ]
    params = [
        {"json_schema": json.dumps(s), "max_new_tokens": 40, "temperature": 0} for s in SCHEMAS
    ]
    return texts, params


def test_outputs_validate_under_llguidance(engine: Engine) -> None:
    assert engine.constraints.backend == "llguidance"
    texts, params = _requests(engine)
    outs = engine.generate(texts, params)
    for schema, out in zip(SCHEMAS, outs):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        jsonschema.validate(json.loads(out["text"]), schema)


def test_refused_keyword_is_a_value_error_naming_its_path(engine: Engine) -> None:
    tags = {"anyOf": [{"type": "array", "uniqueItems": True}, {"type": "array", "maxItems": 3}]}
    schema = {"type": "object", "properties": {"tags": tags}}
    with pytest.raises(ValueError, match="'uniqueItems' at #/properties/tags/anyOf/0"):
        engine.generate("hi", {"json_schema": json.dumps(schema), "max_new_tokens": 4})


def test_unique_items_hold_in_decoded_outputs(engine: Engine) -> None:
    """Three distinct colors out of three, with "red" pushed by a logit bias that makes the
    model write it every time when left alone: the output is a permutation, never a repeat,
    and no request is left at a closing quote that nothing may follow."""
    colors = {"type": "string", "enum": ["red", "green", "blue"]}
    tags = {"type": "array", "items": colors, "uniqueItems": True, "minItems": 3, "maxItems": 3}
    schema = {
        "type": "object",
        "properties": {"colors": tags},
        "required": ["colors"],
        "additionalProperties": False,
    }
    red = [t for t in engine.tokenizer.encode('"red"') if engine.tokenizer.decode([t]) == "red"]
    assert red
    prompt = engine.apply_chat_template([{"role": "user", "content": "Name three colors."}])
    params = {"json_schema": json.dumps(schema), "max_new_tokens": 40, "seed": 3}
    params |= {"logit_bias": {str(t): 30.0 for t in red}}
    for temperature in (0, 1.0):
        out = engine.generate(prompt, params | {"temperature": temperature})
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        assert sorted(json.loads(out["text"])["colors"]) == ["blue", "green", "red"]


def test_outputs_validate_with_keys_in_any_order(engine: Engine) -> None:
    """property_order "any": greedy outputs are valid JSON for their schemas, each key once."""
    texts, params = _requests(engine)
    outs = engine.generate(texts, [p | {"property_order": "any"} for p in params])
    for schema, out in zip(SCHEMAS, outs):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        jsonschema.validate(json.loads(out["text"], object_pairs_hook=_unique_keys), schema)


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    assert len({k for k, _ in pairs}) == len(pairs), pairs
    return dict(pairs)
