"""bench/schema_coverage's bookkeeping: refusal labels and the per-group summary (counts,
wrong schemas, compile percentiles)."""

from __future__ import annotations

from typing import Any

import pytest
from stemma.bench import schema_coverage
from stemma.bench.engine_order import SearchCut, in_engine_order
from stemma.bench.schema_coverage import compact, reason_of, summaries, summarize

_COMPACT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


def test_reason_labels_name_the_keyword_or_the_limit() -> None:
    ll = "json_schema keyword 'not' at #/properties/a is not supported by the llguidance backend"
    assert reason_of(ll) == "not"
    assert reason_of("compiling the constraint took longer than the 10 s limit") == (
        "compile timeout"
    )
    assert reason_of("pattern has 385786 characters, over the limit of 200000") == (
        "regex size limit"
    )
    assert reason_of("json_schema has no valid instance, so no output can match it") == (
        "unsatisfiable"
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


# --- instances in the order the engine emits their keys (engine_order.py) ---

ORDERED = {
    "type": "object",
    "properties": {
        "a": {"type": "integer"},
        "b": {"type": "string"},
        "c": {"type": "array", "items": {"$ref": "#"}},
    },
    "required": ["a"],
    "additionalProperties": False,
}


def _stemma(schema: dict = ORDERED) -> tuple[Any, Any]:
    ev = schema_coverage._Stemma("llguidance", 10.0, "schema")
    return ev, ev.compile(schema)


def _decide(ev: Any, compiled: Any, data: Any, **kw: Any) -> tuple[bool, bool]:
    """(accepted as written, accepted with its keys in an order the engine emits)."""
    tokenize = ev.tokenizer.encode
    as_written = ev.accepts(compiled, tokenize(compact(data)))
    return as_written, in_engine_order(data, ev.walk(compiled), tokenize, **kw)


def test_a_valid_instance_in_another_key_order_is_taken_in_the_engines_order() -> None:
    ev, compiled = _stemma()
    assert _decide(ev, compiled, {"a": 1, "b": "x"}) == (True, True)
    assert _decide(ev, compiled, {"b": "x", "a": 1}) == (False, True)
    # the first key the engine allows is not always the one to place: "c" may begin the
    # object, but then "a" (required) could not follow
    nested = {"c": [{"b": "y", "a": 2}], "b": "x", "a": 1}
    assert _decide(ev, compiled, nested) == (False, True)


def test_a_key_behind_a_required_one_waits_for_it_and_extra_keys_go_last() -> None:
    schema = {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}, "z": {}},
        "required": ["y"],
    }
    ev, compiled = _stemma(schema)
    # at the start "x" and "y" may come; "y" first would pass "x" for good
    assert _decide(ev, compiled, {"z": 3, "y": 2, "x": 1}) == (False, True)
    # a key the schema does not list comes after the listed ones
    assert _decide(ev, compiled, {"$schema": "s", "y": 2}) == (False, True)
    assert _decide(ev, compiled, {"$schema": "s", "x": 1}) == (False, False)  # no "y"


def test_an_invalid_instance_is_refused_in_every_key_order() -> None:
    ev, compiled = _stemma()
    for data in [{"b": 1, "a": 1}, {"b": "x"}, {"a": 1, "d": 0}, {"c": [{"b": "y"}], "a": 1}]:
        assert _decide(ev, compiled, data) == (False, False), data


def test_an_undo_past_the_matchers_rollback_starts_it_again(monkeypatch: Any) -> None:
    from stemma.runtime.constrained import llguidance_matcher

    monkeypatch.setattr(llguidance_matcher, "MAX_ROLLBACK", 2)
    ev, compiled = _stemma()
    walk = ev.walk(compiled)
    start, rest = ev.tokenizer.encode("{"), ev.tokenizer.encode('"a":12345,"b":"long text')
    assert walk.feed(start) and walk.feed(rest) and len(rest) > 2
    assert walk.undo(len(rest)) == len(start)  # fed again to a fresh matcher
    assert walk.feed(ev.tokenizer.encode('"a":1}')) and walk.final()
    # and the search itself goes through such undos
    nested = {"c": [{"b": "y" * 40, "a": 2}], "b": "x", "a": 1}
    assert _decide(ev, compiled, nested) == (False, True)


def test_a_search_past_its_bound_is_cut() -> None:
    ev, compiled = _stemma()
    with pytest.raises(SearchCut):
        _decide(ev, compiled, {"b": "x", "a": 1}, max_fed=3)


def test_each_systems_walk_undoes_and_ends_as_its_matcher_says() -> None:
    ev, compiled = _stemma()
    llg = schema_coverage._LLGuidance.__new__(schema_coverage._LLGuidance)
    llg.tok = compiled._handle._service.ll_tok
    from llguidance import LLMatcher

    grammar = LLMatcher.grammar_from_json_schema(ORDERED, defaults=_COMPACT)
    for walk in (ev.walk(compiled), llg.walk(LLMatcher(llg.tok, grammar, log_level=0))):
        assert not walk.feed(ev.tokenizer.encode('{"b"'))  # refused: nothing taken
        one = ev.tokenizer.encode("1")
        assert walk.feed(ev.tokenizer.encode('{"a":')) and walk.feed(one)
        assert not walk.final()
        assert walk.undo(len(one)) == 0 and walk.feed(ev.tokenizer.encode("7}")) and walk.final()


def test_the_grammar_reference_times_llguidance_on_stemmas_own_grammar() -> None:
    # llguidance-stemma-grammar: the schema resolved as stemma resolves it (here rewritten:
    # llguidance refuses `not` as written) before the clock, then only llguidance's compile
    ev, compiled = _stemma()
    ref = schema_coverage._StemmaGrammar.__new__(schema_coverage._StemmaGrammar)
    ref.tok = compiled._handle._service.ll_tok
    schema = {"type": "object", "properties": {"a": {"type": "integer", "not": {"const": 3}}}}
    grammar = ref.prepare(schema)
    assert '"not"' not in grammar  # the rewrite, not the schema as written
    matcher = ref.compile(grammar)
    four, three = ev.tokenizer.encode('{"a":4}'), ev.tokenizer.encode('{"a":3}')
    assert ref.accepts(matcher, four) and not ref.accepts(matcher, three)
    with pytest.raises(ValueError, match="uniqueItems|not supported"):  # refused as by stemma
        ref.prepare({"type": "array", "items": {"$ref": "#"}, "uniqueItems": True, "not": {}})
