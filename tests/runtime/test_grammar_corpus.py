"""Validity corpus: every output of a fake model decoding under a grammar's masks (greedy and
sampled, jump-forward on and off) fullmatches its regex or validates against its schema."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
from stemma.runtime.constrained.spec import ConstraintSpec

SEEDS = (None, 0, 1)  # None = greedy


def _outputs(handle: Any, fake_lm: Any, decode_text: Any) -> list[str]:
    assert handle.wait(60), "compile did not finish"
    assert handle.error is None, handle.error
    texts = []
    for jump in (False, True):
        for seed in SEEDS:
            ids, _ = fake_lm.generate(handle.matcher(), jump=jump, seed=seed)
            texts.append(decode_text(ids))
    return texts


def test_regex_corpus_outputs_fullmatch(
    grammar_service: Any, regex_corpus: list[str], fake_lm: Any, decode_text: Any
) -> None:
    handles = [grammar_service.submit(rx) for rx in regex_corpus]
    assert len(regex_corpus) >= 20
    for regex, handle in zip(regex_corpus, handles, strict=True):
        for text in _outputs(handle, fake_lm, decode_text):
            assert re.fullmatch(regex, text), (regex, text)


def test_schema_corpus_outputs_validate(
    grammar_service: Any, schema_corpus: list[dict[str, Any]], fake_lm: Any, decode_text: Any
) -> None:
    specs = [ConstraintSpec.create(json_schema=schema) for schema in schema_corpus]
    handles = [grammar_service.submit(spec) for spec in specs]
    assert len(schema_corpus) >= 10
    checker = jsonschema.FormatChecker(formats=["email", "uuid"])  # shape, not calendar
    for schema, handle in zip(schema_corpus, handles, strict=True):
        for text in _outputs(handle, fake_lm, decode_text):
            jsonschema.validate(json.loads(text), schema, format_checker=checker)


@pytest.mark.parametrize("whitespace", [None, r"[ ]?", r"[ \n]{0,2}"])
def test_whitespace_patterns_stay_valid_json(
    grammar_service: Any, fake_lm: Any, decode_text: Any, whitespace: str | None
) -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "b": {"type": "array", "items": {"type": "boolean"}},
        },
        "required": ["a", "b"],
    }
    handle = grammar_service.submit(
        ConstraintSpec.create(json_schema=schema, whitespace=whitespace)
    )
    for text in _outputs(handle, fake_lm, decode_text):
        jsonschema.validate(json.loads(text), schema)
        assert (" " in text or "\n" in text) <= (whitespace is not None)
