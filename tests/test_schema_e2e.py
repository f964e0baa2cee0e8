"""bench/schema_e2e.py: outputs judged by `jsonschema` and sorted by reason; `--early-closing
on` runs only that side, and with it on, outputs of the built-in model end valid."""

from __future__ import annotations

import json
from pathlib import Path

from stemma.bench import common, schema_e2e
from stemma.bench.schema_e2e import verdict

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 9}}}


def out(text: str, finish: str = "stop") -> dict:
    return {"text": text, "meta_info": {"finish_reason": {"type": finish}}}


def test_verdicts_name_why_an_output_fails() -> None:
    assert verdict(SCHEMA, out('{"n": 3}')) == "valid"
    assert verdict(SCHEMA, out('{"n": 12}')) == "refused by jsonschema"
    assert verdict(SCHEMA, out('{"n": 1', "length")) == "cut at the length limit"
    assert verdict(SCHEMA, out('{"n": 1')) == "not JSON"
    assert verdict(SCHEMA, out("", "abort")) == "aborted"


def test_early_closing_on_alone_ends_every_output_valid(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    schemas = [
        {
            "type": "object",
            "properties": {"title": {"type": "string"}, "tags": {"type": "array"}},
            "required": ["title", "tags"],
        },
        {"type": "array", "items": {"type": "string"}},
    ]
    data = tmp_path / "sample.jsonl"
    data.write_text("".join(json.dumps({"schema": s, "tests": []}) + "\n" for s in schemas))
    argv = ["--data", str(data), "--max-new-tokens", "24", "--early-closing", "on"]
    schema_e2e.main([*argv, "--dtype", "float32"])
    lines = (tmp_path / "schema_e2e.jsonl").read_text().splitlines()
    (row,) = [json.loads(line) for line in lines]  # the "off" side did not run
    assert row["early_closing"] is True and row["schemas"] == row["judged"] == 2
    assert row["valid"] == 2, row["failures"]
    assert row["failed"] == {}


def test_a_failed_output_is_written_whole(tmp_path: Path, monkeypatch) -> None:
    """--failures-out: each failed output as a JSON line, with why it failed (a string of
    200 characters takes more than 6 tokens: the output is cut)."""
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    schema = {"type": "array", "items": {"type": "string", "minLength": 200}, "minItems": 1}
    data = tmp_path / "sample.jsonl"
    data.write_text(json.dumps({"group": "g", "name": "a.json", "schema": schema}) + "\n")
    failures = tmp_path / "failures.jsonl"
    argv = ["--data", str(data), "--max-new-tokens", "6", "--early-closing", "off"]
    schema_e2e.main([*argv, "--dtype", "float32", "--failures-out", str(failures)])
    (row,) = [json.loads(line) for line in (tmp_path / "schema_e2e.jsonl").read_text().splitlines()]
    lines = [json.loads(line) for line in failures.read_text().splitlines()]
    assert row["valid"] == 0 and len(lines) == 1
    for line in lines:
        assert line["name"] == "g/a.json" and line["early_closing"] is False
        assert line["verdict"] == "cut at the length limit" and line["finish_reason"] == "length"
        assert line["completion_tokens"] == len(line["output_ids"]) == 6
        assert not line["closed_early"]
        assert schema_e2e.verdict(schema, out(line["text"], "length")) == line["verdict"]


def test_failed_schemas_are_named_by_reason() -> None:
    rows = [{"group": "g", "name": "a.json"}, {"group": "g", "name": "b.json"}, {}]
    verdicts = ["valid", "cut at the length limit", "refused by jsonschema"]
    assert schema_e2e.failed_names(rows, verdicts) == {
        "cut at the length limit": ["g/b.json"],
        "refused by jsonschema": ["#2"],
    }
    assert schema_e2e.failed_names(rows[1:], verdicts[1:], start=1) == {  # a chunk's
        "cut at the length limit": ["g/b.json"],
        "refused by jsonschema": ["#2"],
    }
