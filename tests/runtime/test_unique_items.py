"""`uniqueItems` beside the grammar (unique_items.py, unique_matcher.py), through the real
llguidance backend: a repeated item is refused at the token that would complete it, so the
other ways on stay open; what cannot be enforced exactly is still refused by name. (Instances
decided as `jsonschema` decides them: test_schema_rewrite.py's table.)"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import numpy as np
import pytest
import stemma
from stemma.runtime.constrained import unique_matcher
from stemma.runtime.constrained.ecma_regex import ecma_regex
from stemma.runtime.constrained.instance_paths import canonical
from stemma.runtime.constrained.json_scanner import JsonScanner
from stemma.runtime.constrained.unique_items import unique_arrays
from stemma.runtime.constrained.unique_matcher import SNAPSHOT_EVERY
from stemma.runtime.constraint import _service

INT, STR = {"type": "integer"}, {"type": "string"}
TAGS = {"type": "array", "items": STR, "uniqueItems": True}


def test_a_repeat_is_refused_at_the_token_that_completes_it() -> None:
    c = stemma.Constraint(json_schema=TAGS, backend="llguidance")
    tok = c.tokenizer
    m = c.matcher()
    for t in tok.encode('["ab","a'):
        assert m.accept(t)
    quote = tok.encode('"')[0]
    assert m.allows(quote)  # "a" is new
    for t in tok.encode('",'):
        assert m.accept(t)
    second = tok.encode('"a')
    for t in second:
        assert m.accept(t)
    assert not m.allows(quote)  # a second "a"
    assert m.allows(tok.encode("b")[0])  # "ab..." is still open
    bitmask = np.zeros((c.tokenizer.vocab_size + 31) // 32, dtype=np.int32)
    m.inner.fill_mask(bitmask)
    bits = np.unpackbits(bitmask.view(np.uint8), bitorder="little")
    assert not bits[quote] and bits[tok.encode("b")[0]]
    m.rollback(len(second))  # back to `["ab","a",`: both items are still known
    third = tok.encode('"ab')
    for t in third:
        assert m.accept(t)
    assert not m.allows(quote)
    m.rollback(len(third))
    for t in tok.encode('"c"]'):
        assert m.accept(t)
    assert m.is_final()


@pytest.mark.parametrize("kept", [unique_matcher.MAX_SNAPSHOTS, 2])
def test_a_rollback_past_the_scanners_snapshots_leaves_it_as_a_fresh_walk(
    kept: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a rollback starts from the last snapshot it keeps (SNAPSHOT_EVERY tokens apart; with
    # 2 kept, most go back past them, to the start), not from the first byte: walked back
    # and forth over 40 items, the matcher decides every probe as one fed only what remains
    monkeypatch.setattr(unique_matcher, "MAX_SNAPSHOTS", kept)
    c = stemma.Constraint(json_schema=TAGS, backend="llguidance")
    tok = c.tokenizer
    ids = tok.encode("[" + ",".join(f'"w{i % 30}x"' for i in range(40)) + "]")
    probes = sorted({*tok.encode('"w7x"'), *tok.encode('"w7'), *tok.encode('x",'), *ids[:12]})
    m, fed, rng = c.matcher(), 0, random.Random(0)
    refused = 0
    for _ in range(40):
        if fed and rng.random() < 0.4:
            back = rng.randint(1, fed if rng.random() < 0.2 else min(fed, 3 * SNAPSHOT_EVERY))
            m.rollback(back)
            fed -= back
        for t in ids[fed : fed + rng.randint(1, 2 * SNAPSHOT_EVERY)]:
            if not m.accept(t):  # a repeat (items 30-39 repeat 0-9): walk back from it
                refused += 1
                break
            fed += 1
        fresh = c.matcher()
        assert all(fresh.accept(t) for t in ids[:fed])
        assert [m.allows(t) for t in probes] == [fresh.allows(t) for t in probes], fed
        assert m.inner.scanner.text == fresh.inner.scanner.text
    assert refused and fed > 2 * SNAPSHOT_EVERY  # repeats met, snapshots passed


def test_scanner_follows_keys_whitespace_and_escapes() -> None:
    arrays = unique_arrays({"properties": {"a b": TAGS}})
    for text, unique in [
        ('{ "a b" : [ "x" , "y" ] }', True),
        ('{"a b":["\\"x","\\"x"]}', False),
        ('{"other":["x","x"],"a b":["x"]}', True),
        ('{"a\\u0020b":["x","x"]}', False),
    ]:
        assert JsonScanner(arrays).feed(text.encode()) == unique, text


def test_json_equality() -> None:
    assert canonical(1) == canonical(1.0) and canonical(True) != canonical(1)
    assert canonical({"a": 1, "b": [2]}) == canonical({"b": [2.0], "a": 1})
    assert canonical(None) != canonical(False) and canonical("1") != canonical(1)


STILL_REFUSED = [
    # under `not`: dropping it there would change which instances pass
    ({"type": "array", "not": {"uniqueItems": True, "items": INT}}, "not"),
    # two branches admit arrays: which one holds is not known while decoding
    (
        {"anyOf": [{"type": "array", "uniqueItems": True}, {"type": "array", "maxItems": 3}]},
        "uniqueItems",
    ),
    # under a pattern Python's `re` cannot read as ECMA-262 does: which keys it covers is unknown
    ({"type": "object", "patternProperties": {"(?<=x)y": TAGS}}, "uniqueItems"),
    # recursive
    (
        {
            "$defs": {"t": {"type": "array", "items": {"$ref": "#/$defs/t"}, "uniqueItems": True}},
            "$ref": "#/$defs/t",
        },
        "uniqueItems",
    ),
]


@pytest.mark.parametrize(("schema", "keyword"), STILL_REFUSED, ids=lambda x: json.dumps(x)[:40])
def test_what_cannot_be_enforced_exactly_is_refused_by_name(schema: Any, keyword: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"keyword '{keyword}'")):
        stemma.Constraint(json_schema=schema, backend="llguidance")


@pytest.mark.parametrize(
    ("pattern", "key", "found"),
    [
        ("^a$", "a", True),
        ("^a$", "a\n", False),  # ECMA's $ is only the end
        ("a.b", "a\rb", False),  # and its . stops at \r
        ("a.b", "a\u2028b", False),
        ("\\s", "\u00a0", True),  # its \s has the Unicode spaces
        ("\\d", "\u0663", False),  # its \d only ASCII digits
        ("^[a-z]+\\d?$", "ab1", True),
        ("\\u0041", "A", True),
    ],
)
def test_patterns_are_read_as_ecma_262_reads_them(pattern: str, key: str, found: bool) -> None:
    assert (ecma_regex(pattern).search(key) is not None) == found


@pytest.mark.parametrize(
    "pattern", ["(?<=a)b", "(?<n>a)", "(a)\\1", "\\p{L}", "[^]", "\\Z", "[\\S]"]
)
def test_patterns_read_otherwise_are_not_read(pattern: str) -> None:
    assert ecma_regex(pattern) is None


def test_patterns_and_branches_that_cannot_hold_there_keep_it_exact() -> None:
    """Under `patternProperties` the keyword applies to the keys the pattern matches (as
    ECMA-262 reads it: `$` only at the end); beside them, `additionalProperties` to the keys
    neither listed nor matched. A branch whose value at the array's place cannot be an array
    leaves the other branch the only one that holds there; an `anyOf` with a branch that
    asserts nothing holds for every instance, so what is under it needs no enforcing."""
    schema = {
        "type": "object",
        "properties": {"a": INT},
        "patternProperties": {"^x.$": TAGS},
        "additionalProperties": {
            "anyOf": [
                {"type": "object", "properties": {"codes": TAGS}},
                {"type": "object", "properties": {"codes": INT}},
            ]
        },
    }
    c = stemma.Constraint(json_schema=schema, backend="llguidance")
    assert c.accepts('{"xa":["p","q"],"k":{"codes":["p","q"]}}')
    assert not c.accepts('{"xa":["p","p"]}')
    assert not c.accepts('{"k":{"codes":["p","p"]}}')
    assert c.accepts('{"k":{"codes":3}}')
    assert c.accepts('{"xab":{"codes":["p","r"]}}')  # not matched by ^x.$: an other key
    assert not c.accepts('{"xab":{"codes":["p","p"]}}')
    anything = {"anyOf": [{"properties": {"k": TAGS}}, {"description": "anything"}]}
    c = stemma.Constraint(json_schema=anything, backend="llguidance")
    assert c.accepts('{"k":["p","p"]}')


def test_a_recursive_schema_keeps_the_arrays_outside_its_recursion_exact() -> None:
    """A recursive $ref's target applies at paths without end, so what is under it stays
    refused; an array the recursion never reaches applies at one path, enforced there."""
    tree = {
        "type": "object",
        "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}}},
    }
    schema = {
        "$defs": {"tree": tree},
        "type": "object",
        "properties": {"tags": TAGS, "root": {"$ref": "#/$defs/tree"}},
    }
    assert unique_arrays(schema).node_ids == {id(TAGS)}
    c = stemma.Constraint(json_schema=schema, backend="llguidance")
    assert c.accepts('{"tags":["a","b"],"root":{"kids":[{"kids":[]}]}}')
    assert not c.accepts('{"tags":["a","a"]}')
    inside = {**tree, "properties": {**tree["properties"], "tags": TAGS}}
    with pytest.raises(ValueError, match=re.escape("keyword 'uniqueItems'")):
        stemma.Constraint(json_schema={**schema, "$defs": {"tree": inside}}, backend="llguidance")


def test_an_item_that_could_only_end_as_a_repeat_is_refused_before_its_last_letter() -> None:
    schema = {"type": "array", "items": {"enum": ["red", "blue"]}, "uniqueItems": True}
    c = stemma.Constraint(json_schema=schema, backend="llguidance")
    tok, m = c.tokenizer, c.matcher()
    for t in tok.encode('["red","'):
        assert m.accept(t)
    red = [t for t in tok.encode('"red"') if tok.decode([t]) == "red"][0]
    blue = [t for t in tok.encode('"blue"') if tok.decode([t]) == "blue"][0]
    assert not m.allows(red)  # the grammar would then force the closing quote of a repeat
    assert m.allows(blue)


def test_jump_forward_stops_before_a_forced_repeat() -> None:
    """One value allowed and two items required: the grammar forces `,"x"]` after `["x"`,
    and the draft stops short of the second "x" (the grammar rolled back to match)."""
    schema = {"type": "array", "items": {"const": "x"}, "minItems": 2, "uniqueItems": True}
    c = stemma.Constraint(json_schema=schema, backend="llguidance")
    tok, m = c.tokenizer, c.matcher()
    for t in tok.encode('["x"'):
        assert m.accept(t)
    forced = m.inner.jump_forward(tok, stop_before_merge=False)
    text = '["x"' + tok.decode(forced)
    assert text.count('"x"') == 1 and '["x",'.startswith(text[: len('["x",')])
    assert m.inner.num_accepted == len(tok.encode('["x"')) + len(forced)


def _token_bytes_one_by_one(tokens: list[bytes]) -> dict[str, Any]:
    """What TokenBytes says of each token, worked out token by token."""

    def quote_then_more(b: bytes) -> bool:
        q = b.find(b'"')
        return q >= 0 and any(c in b[q + 1 :] for c in b",]}")

    by_quoted: dict[bytes, list[int]] = {}
    for i, b in enumerate(tokens):
        if b'"' in b:
            by_quoted.setdefault(b[: b.index(b'"') + 1], []).append(i)
    return {
        "has_quote": [b'"' in b for b in tokens],
        "has_backslash": [b"\\" in b for b in tokens],
        "may_end": [b.count(b'"') > 1 or any(c in b for c in b",]} \t\n\rel") for b in tokens],
        "structural": [any(c in b for c in b'",]}') for b in tokens],
        "quote_then_more": [quote_then_more(b) for b in tokens],
        "opens": [i for i, b in enumerate(tokens) if b"{" in b or b"[" in b],
        "by_quoted": by_quoted,
        "id_of": {b: i for i, b in enumerate(tokens) if b},
    }


def test_token_bytes_counted_at_once_say_what_each_token_says() -> None:
    """TokenBytes reads the whole vocabulary's bytes at once; every fact equals the one worked
    out token by token, on SmolLM2's vocabulary and on tokens made for the corners (empty,
    a quote last, brackets before the first quote, two quotes, a backslash)."""
    made = [b"", b'"', b'a"', b'],"', b'"x",', b'""', b"\\", b'{"a":', b"el", b'x"]']
    tokenizer, service = _service("smollm2-135m", "llguidance", 20.0)
    vocabulary = service.token_bytes().bytes
    assert len(vocabulary) == tokenizer.vocab_size
    for tokens in (made, vocabulary):
        counted = unique_matcher.TokenBytes(tokens)
        expected = _token_bytes_one_by_one(tokens)
        for name in ("has_quote", "has_backslash", "may_end", "structural", "quote_then_more"):
            assert getattr(counted, name).tolist() == expected[name], name
        assert counted.opens.tolist() == expected["opens"]
        assert counted.by_quoted == expected["by_quoted"]
        assert counted.id_of == expected["id_of"]
