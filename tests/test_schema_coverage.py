"""bench/schema_coverage's bookkeeping: refusal labels and the per-group summary (counts,
wrong schemas, compile percentiles)."""

from __future__ import annotations

from stemma.bench import schema_coverage
from stemma.bench.schema_coverage import compact, reason_of, summaries, summarize


def test_reason_labels_name_the_keyword_or_the_limit() -> None:
    ll = "json_schema keyword 'not' at #/properties/a is not supported by the llguidance backend"
    assert reason_of(ll) == "not"
    assert reason_of("compiling the constraint took longer than the 10 s limit") == (
        "compile timeout"
    )
    assert reason_of("pattern has 385786 characters, over the limit of 200000") == (
        "regex size limit"
    )
    oc = "json_schema keywords outlines-core would silently ignore (...): #/items: minimum"
    assert reason_of(oc) == "minimum"
    assert reason_of("[09:51:27] /x/json_schema_converter.cc:4950: Cannot handle a b c d") == (
        "Cannot handle a b c d"
    )


def test_summary_counts_ok_refused_wrong_and_percentiles() -> None:
    results = [
        {"status": "compiled", "compile_s": 0.001, "valid_refused": 0, "invalid_accepted": 0},
        {"status": "compiled", "compile_s": 0.003, "valid_refused": 2, "invalid_accepted": 0},
        {"status": "compiled", "compile_s": 0.002, "valid_refused": 0, "invalid_accepted": 1},
        {"status": "refused", "reason": "not", "error": "..."},
        {"status": "refused", "reason": "not", "error": "..."},
    ]
    row = summarize("s", "g", results)
    assert (row["schemas"], row["ok"], row["refused"], row["wrong"]) == (5, 1, 2, 2)
    assert (row["valid_refused"], row["invalid_accepted"]) == (2, 1)
    assert row["refused_by_reason"] == {"not": 2}
    assert (row["compile_p50_ms"], row["compile_max_ms"]) == (2.0, 3.0)
    assert row["ok_pct"] == 20.0


def test_instances_are_serialized_compactly() -> None:
    assert compact({"a": [1, "é"], "b": None}) == '{"a":[1,"é"],"b":null}'


def test_common_rows_take_the_schemas_every_system_compiled() -> None:
    def compiled(ms: float) -> dict:
        return {"group": "g", "status": "compiled", "compile_s": ms / 1000} | {
            "valid_refused": 0,
            "invalid_accepted": 0,
        }

    refused = {"group": "g", "status": "refused", "reason": "not", "error": "..."}
    a = [compiled(1.0), compiled(2.0), compiled(50.0)]  # compiles the hard third schema
    b = [compiled(1.5), compiled(2.5), refused]
    rows = {(r["system"], r["group"]): r for r in summaries(["a", "b"], [a, b])}
    assert rows["a", "total"]["compile_max_ms"] == 50.0 and rows["a", "total"]["schemas"] == 3
    assert rows["a", "common"]["schemas"] == 2 and rows["a", "common"]["compile_max_ms"] == 2.0
    assert rows["b", "common"]["schemas"] == 2 and rows["b", "common"]["compile_max_ms"] == 2.5


def test_a_reference_not_installed_is_recorded_as_none() -> None:
    # xgrammar comes with the bench extra only; a run without it still records its rows
    assert schema_coverage._version("llguidance")
    assert schema_coverage._version("no-such-package-stemma-test") is None
