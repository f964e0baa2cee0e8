"""The llguidance backend: masks agree with the outlines backend (llguidance keeps only the
canonical token where bytes are forced), JSON Schema semantics (open objects, $ref, anyOf,
bounds), refusals named by keyword and schema path, jump-forward and rollback, and the public
stemma.Constraint over both backends."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import jsonschema
import numpy as np
import pytest
import stemma
from stemma.runtime.constrained.backend import check_spec
from stemma.runtime.constrained.llguidance_backend import LLGuidanceService
from stemma.runtime.constrained.llguidance_grammar import (
    Resolution,
    Resolutions,
    combinators_first,
    combinators_move,
    with_options,
)
from stemma.runtime.constrained.llguidance_matcher import LLGuidanceMatcher
from stemma.runtime.constrained.spec import ConstraintSpec


@pytest.fixture(scope="module")
def ll_service(smollm_tokenizer: Any) -> Iterator[LLGuidanceService]:
    service = LLGuidanceService(smollm_tokenizer)
    yield service
    service.close()


def _matcher(service: Any, spec: ConstraintSpec | str) -> Any:
    handle = service.submit(spec)
    assert handle.wait(60) and handle.error is None, handle.error
    return handle.matcher()


def _allowed(matcher: Any, vocab_size: int) -> set[int]:
    row = np.empty((vocab_size + 31) // 32, dtype=np.int32)
    matcher.fill_mask(row)
    return set(np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")).tolist())


TOOL = {
    "type": "object",
    "properties": {"name": {"const": "get_weather"}, "days": {"type": "integer"}},
    "required": ["name", "days"],
    "additionalProperties": False,
}
AGREE = [
    (ConstraintSpec(regex="(yes|no)"), "no"),
    (ConstraintSpec(regex=r"[0-9]{4}-(0[1-9]|1[0-2])"), "2024-05"),
    (ConstraintSpec(regex="#[0-9a-fA-F]{6}"), "#a0B1c2"),
    (ConstraintSpec.create(json_schema=TOOL), '{"name":"get_weather","days":12}'),
    (
        ConstraintSpec.create(json_schema={"type": "array", "items": {"type": "integer"}}),
        "[1,-20,300]",
    ),
]


@pytest.mark.parametrize(("spec", "text"), AGREE, ids=[t for _, t in AGREE])
def test_masks_agree_with_outlines(
    spec: ConstraintSpec, text: str, ll_service: Any, grammar_service: Any, smollm_tokenizer: Any
) -> None:
    """Where no byte is forced the masks are equal; where one is, llguidance allows only the
    canonical token, a subset of what outlines allows. EOS agrees everywhere."""
    vocab_size = smollm_tokenizer.vocab_size
    ll, oc = _matcher(ll_service, spec), _matcher(grammar_service, spec)
    num_free = 0
    for token_id in [*smollm_tokenizer.encode(text), None]:
        ll_ids, oc_ids = _allowed(ll, vocab_size), _allowed(oc, vocab_size)
        assert ll_ids <= oc_ids
        if not ll._m.compute_ff_bytes():
            assert ll_ids == oc_ids
            num_free += 1
        assert ll.is_final() == oc.is_final()
        if token_id is not None:
            assert token_id in ll_ids
            ll.accept_token(token_id)
            oc.accept_token(token_id)
    assert ll.is_final() and num_free >= 2


SEMANTICS = [  # (schema, accepted instances, rejected instances)
    ({"type": "object", "properties": {"a": {"type": "integer"}}}, [{"a": 1, "b": "x"}], []),
    (
        {"properties": {"a": {"type": "integer"}}, "additionalProperties": False},
        [{"a": 1}, {}],
        [{"a": 1, "b": 2}],
    ),
    (
        {"type": "object", "additionalProperties": {"type": "integer"}},
        [{"k": 2}],
        [{"k": "x"}],
    ),
    (
        {"$defs": {"pos": {"type": "integer", "minimum": 1}}, "$ref": "#/$defs/pos"},
        [1, 7],
        [0, -3],
    ),
    ({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "null"}]}, ["ab", None], ["abc"]),
    ({"allOf": [{"type": "integer"}, {"maximum": 5}]}, [5], [6, 1.5]),
    ({"enum": ["a", 1, None]}, ["a", 1, None], ["b", 2]),
    ({"const": {"k": [1, 2]}}, [{"k": [1, 2]}], [{"k": [1]}]),
    ({"type": "number", "exclusiveMinimum": 0, "maximum": 1}, [0.5, 1], [0, 1.5]),
    ({"type": "string", "pattern": "^[a-z]+[0-9]$"}, ["ab1"], ["ab", "1"]),
    ({"type": "string", "format": "date"}, ["2024-02-29"], ["2024-13-01", "x"]),
    ({"type": "array", "minItems": 2, "maxItems": 3}, [[1, "a"]], [[1], [1, 2, 3, 4]]),
    (  # keys in any order in the document: llguidance 1.9 reads them around the allOf
        {
            "additionalProperties": False,
            "allOf": [{"type": "object"}],
            "patternProperties": {"^id$": {"type": "string"}},
        },
        [{"id": "a"}, {}],
        [{"id": 1}, {"x": "a"}],
    ),
]


OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


@pytest.mark.parametrize(
    "text",
    [
        "{}",
        ' { "type" : "object" } ',
        '{"type": "string", "x-guidance": {"lenient": true}}',  # merged with the schema's own
        json.dumps(SEMANTICS[-1][0]),
    ],
)
def test_options_written_into_the_text_are_llguidances_own_merge(text: str) -> None:
    from llguidance import LLMatcher

    merged = LLMatcher.grammar_from_json_schema(text, overrides=OPTIONS)
    ours = json.loads(with_options(text, OPTIONS))["grammars"][0]["json_schema"]
    assert ours == json.loads(merged)["grammars"][0]["json_schema"]
    assert list(ours)[-1] == "x-guidance"  # after every keyword, as llguidance puts them


@pytest.mark.parametrize(
    ("schema", "moves"),
    [
        ({"patternProperties": {"a": {}}, "allOf": [{}]}, True),
        ({"allOf": [{}], "patternProperties": {"a": {}}}, False),  # already ahead
        ({"properties": {"p": {"patternProperties": {}, "x": 1, "$ref": "#"}}}, True),
        ({"properties": {"p": {"x": 1, "$ref": "#"}}}, False),  # no patternProperties
    ],
)
def test_combinators_move_where_combinators_first_moves_them(schema: Any, moves: bool) -> None:
    assert combinators_move(json.dumps(schema)) is moves
    assert (list(json.dumps(combinators_first(schema))) != list(json.dumps(schema))) is moves


@pytest.mark.parametrize(("schema", "good", "bad"), SEMANTICS, ids=lambda x: json.dumps(x)[:40])
def test_json_schema_semantics(schema: Any, good: list[Any], bad: list[Any]) -> None:
    c = stemma.Constraint(json_schema=schema, backend="llguidance")
    for value in good:
        assert c.accepts(json.dumps(value, separators=(",", ":"))), value
    for value in bad:
        assert not c.accepts(json.dumps(value, separators=(",", ":"))), value


REFUSED = [
    (  # two branches admit arrays: not enforced beside the grammar (unique_items.py)
        {"properties": {"x": {"anyOf": [{"uniqueItems": True}, {"maxItems": 2}]}}},
        "uniqueItems",
        "#/properties/x/anyOf/0",
    ),
    (
        {"$defs": {"d": {"not": {"pattern": "x"}}}, "properties": {"u": {"$ref": "#/$defs/d"}}},
        "not",
        "#/$defs/d",
    ),
    ({"properties": {"a": {"if": {"type": "integer"}, "then": {}}}}, "if", "#/properties/a"),
    (
        {"properties": {"n": {"anyOf": [{"oneOf": [{"type": "integer"}, {"type": "number"}]}]}}},
        "oneOf",
        "#/properties/n/anyOf/0",
    ),
]


@pytest.mark.parametrize(("schema", "keyword", "path"), REFUSED, ids=[k for _, k, _ in REFUSED])
def test_refusals_name_keyword_and_path(schema: Any, keyword: str, path: str) -> None:
    spec = ConstraintSpec.create(json_schema=schema)
    named = re.escape(f"'{keyword}' at {path} ")
    with pytest.raises(ValueError, match="json_schema keyword " + named) as err:
        check_spec("llguidance", spec)
    assert "strict=False" in str(err.value)
    with pytest.raises(ValueError, match=named):
        stemma.Constraint(json_schema=schema, backend="llguidance")


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "minimum": 5, "maximum": 2},
        # as written llguidance refuses its oneOf; rewritten, it finds `d` can never pass
        {
            "type": "object",
            "properties": {
                "d": {
                    "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
                    "required": ["a", "b"],
                }
            },
            "required": ["d"],
        },
    ],
)
def test_a_schema_no_value_passes_is_refused_as_such(schema: Any) -> None:
    with pytest.raises(ValueError, match="json_schema has no valid instance") as err:
        stemma.Constraint(json_schema=schema, backend="llguidance")
    assert "Unsatisfiable schema" in str(err.value) and "oneOf" not in str(err.value)
    with pytest.raises(ValueError, match="no valid instance"):
        check_spec("llguidance", ConstraintSpec.create(json_schema=schema))


def test_a_pattern_llguidance_cannot_parse_is_refused_with_the_reason() -> None:
    schema = {"type": "string", "pattern": "a{0,4294967296}"}
    with pytest.raises(ValueError) as err:
        stemma.Constraint(json_schema=schema, backend="llguidance")
    message = str(err.value)
    assert "regex parse error: a{0,4294967296}" in message and "decimal literal" in message
    assert "^^" not in message and "\n" not in message


def test_not_strict_approximates_and_warns() -> None:
    c = stemma.Constraint(
        json_schema={"type": "array", "uniqueItems": True}, backend="llguidance", strict=False
    )
    assert c.accepts("[1,1]")
    assert any("uniqueItems" in w for w in c.warnings)


def test_jump_forward_forces_the_constant_prefix_and_rolls_back(
    ll_service: Any, smollm_tokenizer: Any
) -> None:
    m: LLGuidanceMatcher = _matcher(ll_service, ConstraintSpec.create(json_schema=TOOL))
    forced = m.jump_forward(smollm_tokenizer)
    text = smollm_tokenizer.decode(forced)
    assert forced and '{"name":"get_weather","days":'.startswith(text)
    assert m.num_accepted == len(forced)
    m.rollback(len(forced))
    assert m.num_accepted == 0
    draft = m.jump_forward(smollm_tokenizer, stop_before_merge=False)
    assert smollm_tokenizer.decode(draft) == '{"name":"get_weather","days":'
    assert draft[: len(forced)] == forced
    for token_id in smollm_tokenizer.encode("42}"):
        m.accept_token(token_id)
    assert m.is_final() and m.is_finished() and m.jump_forward(smollm_tokenizer) == []


def test_eos_is_allowed_exactly_in_final_states(ll_service: Any, smollm_tokenizer: Any) -> None:
    m = _matcher(ll_service, "[0-9]{1,3}")
    eos = set(smollm_tokenizer.eos_token_ids)
    vocab_size = smollm_tokenizer.vocab_size
    assert eos.isdisjoint(_allowed(m, vocab_size)) and not m.is_final()
    m.accept_token(smollm_tokenizer.encode("7")[0])
    assert eos <= _allowed(m, vocab_size) and m.allows(min(eos))
    with pytest.raises(ValueError, match="not allowed"):
        m.accept_token(smollm_tokenizer.encode("x")[0])
    m.accept_token(min(eos))
    assert m.is_terminated and m.is_finished() and not _allowed(m, vocab_size)


# Strings under `not` of patterns that llguidance 1.9's lexer builds too many expressions for
# (a real-world schema's pattern tests, cut down): it compiles, and fails a token in.
LEXER_LIMIT = {
    "type": "string",
    "pattern": "[aA][12].*[zZ]",
    "minLength": 10,
    "maxLength": 90,
    "not": {
        "allOf": [
            {"not": {"anyOf": [{"pattern": p} for p in ("^....$", "ab1", "b12")]}},
            {"not": {"anyOf": [{"pattern": p} for p in ("^[\\w]*$", "\\d\\d", "[a|b]")]}},
        ]
    },
}


def test_a_grammar_that_fails_mid_way_says_why_it_cannot_roll_back(
    ll_service: Any, smollm_tokenizer: Any
) -> None:
    """Early closing's search rolls back each token it tries; once llguidance failed (here its
    lexer's limit), the rollback is refused, and the request's abort names the failure."""
    m: LLGuidanceMatcher = _matcher(ll_service, ConstraintSpec.create(json_schema=LEXER_LIMIT))
    (quote_brace,) = smollm_tokenizer.encode('"{')
    m.accept_token(quote_brace)
    _allowed(m, smollm_tokenizer.vocab_size)
    assert m.error == (
        "constraint failed after 1 tokens: lexer error: too many expressions constructed"
    )
    with pytest.raises(ValueError, match=r"cannot roll back 1 tokens \(constraint failed"):
        m.rollback(1)


@pytest.mark.parametrize("backend", ["outlines", "llguidance"])
def test_constraint_api(backend: str) -> None:
    c = stemma.Constraint(choices=["yes", "no"], backend=backend)
    assert c.accepts("yes") and not c.accepts("ye") and not c.accepts("yess")
    assert c.accepts(c.tokenizer.encode("no"))
    m = c.matcher()
    first, rest = c.tokenizer.encode("y")[0], c.tokenizer.encode("es")
    assert m.allows(first) and not m.is_final()
    assert not m.accept(c.tokenizer.encode("n")[0] + 10_000)
    assert m.accept(first) and all(m.accept(t) for t in rest) and m.is_final()


def test_constraint_api_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="grammar_backend must be one of"):
        stemma.Constraint(regex="a", backend="xgrammar")
    with pytest.raises(ValueError, match="exactly one"):
        stemma.Constraint(regex="a", choices=["b"], backend="llguidance")


@pytest.mark.parametrize("num_hung", [1, 2])
def test_compile_past_the_time_limit_fails_only_its_request(
    smollm_tokenizer: Any, num_hung: int
) -> None:
    """The compile_hang switch holds builds until the service closes: each such request fails
    naming the limit, and, with every builder stuck (2 of 2), the builders that take their
    places compile the next constraint."""
    from stemma.runtime.constrained.vocabulary import CompileLimits
    from stemma.runtime.faults import Faults

    faults = Faults(enabled=True)
    faults.arm("compile_hang", num_hung)
    service = LLGuidanceService(
        smollm_tokenizer, CompileLimits(timeout_s=0.2), num_workers=2, faults=faults
    )
    try:
        hung = [service.submit(f"[a-z]{{{3 + i}}}") for i in range(num_hung)]
        for handle in hung:
            assert handle.wait(30) and "longer than the 0.2 s limit" in (handle.error or "")
            with pytest.raises(ValueError, match="0.2 s limit"):
                handle.matcher()
        # The next compile gets a limit no machine comes near: only the hangs may time out.
        service.limits = CompileLimits(timeout_s=60.0)
        fine = service.submit("[0-9]{2}")
        assert fine.wait(30) and fine.error is None and not fine.matcher().is_final()
    finally:
        service.close()
    assert faults.fired["compile_hang"] == num_hung


def test_engine_config_names_the_grammar_backends() -> None:
    from stemma.runtime.config import EngineConfig

    assert EngineConfig(grammar_backend="llguidance").grammar_backend == "llguidance"
    with pytest.raises(ValueError, match=r"one of \('outlines', 'llguidance'\), got 'xgrammar'"):
        EngineConfig(grammar_backend="xgrammar")


def test_constraint_defaults_to_the_engines_backend() -> None:
    from stemma.runtime.config import EngineConfig

    assert stemma.Constraint(regex="a|b").backend == EngineConfig().grammar_backend


VERIFIED = [
    {
        "type": "object",
        "properties": {
            "name": {"const": "get_weather"},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "city": {"type": "string", "maxLength": 6},
        },
        "required": ["name", "unit", "days", "city"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"enum": [True, None, "x"]}, "minItems": 2, "maxItems": 3},
]


def _decode(
    matcher: Any, scores: np.ndarray, tokenizer: Any, *, draft: bool
) -> tuple[list[int], int]:
    """Greedy decoding by a fixed-score model under the mask; with `draft`, each step's
    forced text is drafted, rolled back, and kept only while the model picks the same token
    (the scheduler's verified jump-forward, runtime/scheduler/draft.py). Returns the ids
    and how many drafted tokens the model confirmed; ends at EOS."""
    vocab_size, ids, num_confirmed = len(scores), [], 0
    row = np.empty((vocab_size + 31) // 32, dtype=np.int32)
    eos = set(tokenizer.eos_token_ids)

    def pick() -> int:
        matcher.fill_mask(row)
        bits = np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab_size]
        return int(np.argmax(np.where(bits.astype(bool), scores, -np.inf)))

    for _ in range(200):
        pending = []
        if draft:
            pending = matcher.jump_forward(tokenizer, stop_before_merge=False)
            matcher.rollback(len(pending))
        for proposed in [*pending, None]:
            token = pick()
            matcher.accept_token(token)
            if token in eos:
                return ids, num_confirmed
            ids.append(token)
            if token != proposed:
                break
            num_confirmed += 1
    raise AssertionError("no EOS in 200 steps")


@pytest.mark.parametrize("schema", VERIFIED, ids=["object", "array"])
def test_verified_drafts_keep_token_by_token_output(
    schema: Any, ll_service: Any, smollm_tokenizer: Any
) -> None:
    scores = np.random.default_rng(7).standard_normal(smollm_tokenizer.vocab_size)
    spec = ConstraintSpec.create(json_schema=schema)
    plain, _ = _decode(_matcher(ll_service, spec), scores, smollm_tokenizer, draft=False)
    drafted, num_confirmed = _decode(
        _matcher(ll_service, spec), scores, smollm_tokenizer, draft=True
    )
    assert drafted == plain and num_confirmed >= 2
    json_text = smollm_tokenizer.decode(plain)
    jsonschema.validate(json.loads(json_text), schema)


@pytest.fixture
def llguidance_calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts what goes through llguidance.LLMatcher: `grammar` (a schema made a grammar),
    `validate` (a grammar checked without the vocabulary), `matcher` (one built over it)."""
    import llguidance

    real, calls = llguidance.LLMatcher, Counter[str]()

    class Counting:
        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            calls["matcher"] += 1
            return real(*args, **kwargs)

        @staticmethod
        def grammar_from_json_schema(*args: Any, **kwargs: Any) -> str:
            calls["grammar"] += 1
            return real.grammar_from_json_schema(*args, **kwargs)

        @staticmethod
        def validate_grammar_with_warnings(*args: Any, **kwargs: Any) -> Any:
            calls["validate"] += 1
            return real.validate_grammar_with_warnings(*args, **kwargs)

    monkeypatch.setattr(llguidance, "LLMatcher", Counting)
    return calls


def _rewritten_schema(name: str) -> dict[str, Any]:
    """A schema llguidance refuses as written (`dependencies`) and takes rewritten; `name`
    makes it one no other test has resolved."""
    properties = {name: {"type": "integer"}, "b": {"type": "integer"}}
    return {"type": "object", "properties": properties, "dependencies": {name: ["b"]}}


def test_a_checked_spec_is_compiled_from_the_grammar_it_resolved_to(
    ll_service: Any, llguidance_calls: Counter[str]
) -> None:
    spec = ConstraintSpec.create(json_schema=_rewritten_schema("checked"))
    check_spec("llguidance", spec)  # rewritten (taken): surely refused as written
    assert llguidance_calls == {"grammar": 1, "validate": 1}
    _matcher(ll_service, spec)
    check_spec("llguidance", spec)
    assert llguidance_calls == {"grammar": 1, "validate": 1, "matcher": 1}


def test_a_compiled_spec_is_checked_without_building_it_again(
    llguidance_calls: Counter[str],
) -> None:
    """stemma.Constraint waits for the compile, which refuses what the check would: it builds
    the grammars once, and a later check at a request boundary builds nothing."""
    c = stemma.Constraint(json_schema=_rewritten_schema("compiled"), backend="llguidance")
    assert c.accepts('{"compiled":1,"b":2}') and not c.accepts('{"compiled":1}')
    assert llguidance_calls == {"grammar": 1, "matcher": 1}
    check_spec("llguidance", c.spec)
    assert llguidance_calls == {"grammar": 1, "matcher": 1}


def test_a_refusal_is_found_once_and_worded_the_same_everywhere(
    ll_service: Any, llguidance_calls: Counter[str]
) -> None:
    """The compile after a check raises the check's refusal without building anything; a
    compile with no check first refuses in the check's words."""
    schema = {"properties": {"refused": {"type": "string", "pattern": "a{0,4294967296}"}}}
    spec = ConstraintSpec.create(json_schema=schema)
    with pytest.raises(ValueError) as checked:
        check_spec("llguidance", spec)
    calls = dict(llguidance_calls)
    handle = ll_service.submit(spec)
    assert handle.wait(60) and handle.error == str(checked.value)
    assert llguidance_calls == calls  # the compile raised the refusal the check found
    fresh = {"properties": {"refused_too": {"type": "string", "pattern": "a{0,4294967296}"}}}
    with pytest.raises(ValueError) as compiled:
        stemma.Constraint(json_schema=fresh, backend="llguidance")
    with pytest.raises(ValueError) as checked_after:
        check_spec("llguidance", ConstraintSpec.create(json_schema=fresh))
    assert str(compiled.value) == str(checked_after.value)
    assert "regex parse error: a{0,4294967296}" in str(compiled.value)


def test_resolutions_are_bounded_least_recently_used_first() -> None:
    resolutions = Resolutions(max_entries=2)
    specs = [ConstraintSpec(regex=f"[a-z]{{{n}}}") for n in range(3)]
    for n, spec in enumerate(specs[:2]):
        resolutions.put(spec, 500_000, Resolution(grammar=f"g{n}"))
    assert resolutions.get(specs[0], 500_000) == Resolution(grammar="g0")  # now most recent
    assert resolutions.get(specs[0], 1_000_000) is None  # another grammar-size limit
    resolutions.put(specs[2], 500_000, Resolution(error="refused"))
    assert resolutions.get(specs[1], 500_000) is None
    assert resolutions.get(specs[0], 500_000) == Resolution(grammar="g0")
    assert resolutions.get(specs[2], 500_000) == Resolution(error="refused")
