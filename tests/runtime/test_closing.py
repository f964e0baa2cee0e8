"""Early closing (constrained/closing.py): a completion search that leaves the matcher as it
found it, and on the engine a JSON output that ends valid within max_new_tokens, flagged,
where without it the output is cut; regex constraints and close_early=False are untouched."""

from __future__ import annotations

import collections
import json
import math
import re
import tracemalloc
from types import SimpleNamespace

import jsonschema
import numpy as np
import pytest
import stemma
import torch
from stemma.runtime.constrained.closing import ClosingMatcher
from stemma.runtime.constrained.closing_search import ClosingTokens, Nesting, closing_path
from stemma.runtime.constrained.pattern_example import pattern_example, schema_examples
from stemma.runtime.engine import Engine
from stemma.runtime.sampling.params import SamplingParams
from stemma.runtime.sampling.sampler import Sampler, SamplingState
from stemma.runtime.scheduler.output_processor import OutputProcessor
from stemma.runtime.scheduler.req import LogprobRequest

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "qty": {"type": "integer"}},
                "required": ["name", "qty"],
            },
        },
    },
    "required": ["title", "items"],
}


def _allowed(m, vocab: int) -> np.ndarray:
    row = np.zeros((vocab + 31) // 32, dtype=np.int32)
    m.fill_mask(row)
    return row


@pytest.fixture(scope="module")
def closing_tokens() -> ClosingTokens:
    tokenizer = stemma.Constraint(regex="x", backend="llguidance").tokenizer
    return ClosingTokens.from_tokenizer(tokenizer)  # a pass over the vocabulary: once


@pytest.mark.parametrize("backend", ["llguidance", "outlines"])
@pytest.mark.parametrize(
    "prefix", ['{"title":"Sh', '{"title":"x","items":[{"name":"egg', '{"title":"x","items":[{"']
)
def test_closing_path_completes_and_leaves_the_matcher_as_it_was(
    backend, prefix, closing_tokens
) -> None:
    c = stemma.Constraint(json_schema=SCHEMA, backend=backend)
    m = c.matcher().inner
    for t in c.tokenizer.encode(prefix):
        m.accept_token(t)
    before = _allowed(m, c.tokenizer.vocab_size)
    tokens = closing_tokens
    path = closing_path(m, 40, tokens, c.tokenizer, Nesting().feed(prefix))
    assert path is not None and len(path) <= 40
    assert (before == _allowed(m, c.tokenizer.vocab_size)).all()  # rolled back
    for t in path:
        m.accept_token(t)
    assert m.is_final()
    jsonschema.validate(json.loads(prefix + c.tokenizer.decode(path)), SCHEMA)
    assert closing_path(c.matcher().inner, 2, tokens, c.tokenizer) is None  # no room: None


UUID = "^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$"
# An order whose shortest completion is long: six required keys, two of them 36-character ids
# that the search writes a character at a time (about 100 tokens in all).
ORDER = {
    "type": "object",
    "properties": {
        "orders": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "note": {"type": "string"},
                    "card": {"type": "string", "pattern": UUID},
                    "id": {"type": "integer"},
                    "ref": {"type": "string", "pattern": UUID},
                    "time": {"type": "string", "pattern": "^[0-2][0-9](:[0-5][0-9]){2}$"},
                    "size": {"enum": ["Small", "Large"]},
                },
                "required": ["note", "card", "id", "ref", "time", "size"],
            },
        }
    },
    "required": ["orders"],
}


@pytest.mark.parametrize(
    "schema, prefix",
    [
        (ORDER, '{"orders":[{"note":"a long note'),
        # a fraction's digits can go on forever: the search must leave the run for the "Z"
        ({"type": "string", "pattern": r"^\d{2}:\d{2}(\.\d+)?Z$"}, '"20:00.000000'),
        # a recursion the output went deep into: one closing bracket per level
        (
            {
                "$ref": "#/$defs/n",
                "$defs": {"n": {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}}},
            },
            '{"n":' * 40,
        ),
    ],
)
def test_long_and_looping_completions_are_found(schema, prefix, closing_tokens) -> None:
    c = stemma.Constraint(json_schema=schema, backend="llguidance")
    m = c.matcher().inner
    for t in c.tokenizer.encode(prefix):
        m.accept_token(t)
    path = closing_path(m, 200, closing_tokens, c.tokenizer, Nesting().feed(prefix))
    assert path is not None
    for t in path:
        m.accept_token(t)
    assert m.is_final()
    jsonschema.validate(json.loads(prefix + c.tokenizer.decode(path)), schema)


# A string under a pattern it does not match yet: one token at a time the search wanders (an
# unanchored pattern lets every character through until the text holds a match; an anchored
# one loops on a character class); it closes by writing the pattern's example, whole or its rest.
STAMPED = {"type": "string", "pattern": r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}"}
IGLU = {"type": "string", "pattern": "^iglu:[a-z0-9_.-]+/[a-z]+/[0-9]+-[0-9]+$"}


@pytest.mark.parametrize(
    "string, prefix, example",
    [
        (STAMPED, '"1234567890,1234567890,', "0000-00-00 00:00"),
        (IGLU, '"iglu:', "iglu:a/a/0-0"),  # the grammar forced "iglu:": its rest is written
        (IGLU, '"iglu:com.acme_', "iglu:a/a/0-0"),  # the rest after ":"
    ],
)
def test_a_string_under_a_pattern_closes_by_writing_its_example(
    string, prefix, example, closing_tokens
) -> None:
    schema = {"type": "object", "properties": {"at": string}, "required": ["at"]}
    prefix = '{"at":' + prefix
    assert schema_examples(json.dumps(schema)) == (example,)
    c = stemma.Constraint(json_schema=schema, backend="llguidance")
    paths = {}
    for name, moves in (("with", [example]), ("without", ())):
        m = c.matcher().inner
        for t in c.tokenizer.encode(prefix):
            m.accept_token(t)
        at = Nesting().feed(prefix)
        paths[name] = path = closing_path(m, 60, closing_tokens, c.tokenizer, at, moves, prefix)
        for t in path or ():
            m.accept_token(t)
        if path is not None:
            assert m.is_final()
            jsonschema.validate(json.loads(prefix + c.tokenizer.decode(path)), schema)
    assert paths["without"] is None  # one token at a time, the budget runs out
    assert paths["with"] is not None and len(paths["with"]) <= 20


UUID = {
    "type": "string",
    "pattern": "^[a-f0-9]{8}-[a-f0-9]{4}-[1-5][a-f0-9]{3}-[89ab][a-f0-9]{3}-[a-f0-9]{12}$",
}


def test_a_fixed_width_string_closes_with_its_example_in_place(closing_tokens) -> None:
    """Four digits of a UUID written: the example's rest after four characters closes it
    (its rest after a `-` would put `8` where the third group needs 1-5)."""
    schema = {"type": "object", "properties": {"id": UUID}, "required": ["id"]}
    example = "aaaaaaaa-aaaa-1aaa-8aaa-aaaaaaaaaaaa"
    assert schema_examples(json.dumps(schema)) == (example,)
    c = stemma.Constraint(json_schema=schema, backend="llguidance")
    m = c.matcher().inner
    prefix = '{"id":"1234'
    for t in c.tokenizer.encode(prefix):
        m.accept_token(t)
    path = closing_path(
        m, 60, closing_tokens, c.tokenizer, Nesting().feed(prefix), [example], prefix
    )
    assert path is not None
    assert c.tokenizer.decode(path) == example[4:] + '"}'
    jsonschema.validate(json.loads(prefix + c.tokenizer.decode(path)), schema)


@pytest.mark.parametrize(
    "pattern, example",
    [
        (r"\d{4}-\d{2}", "0000-00"),
        ("^[a-z]+@[a-z]+\\.com$", "a@a.com"),
        ("^(https?|ftp)://[^ ]+$", "ftp://a"),
        ("^[^abc]{2,3}$", "00"),
        ('^"\\\\$', '"\\'),
        ("^$", None),  # nothing to write
        ("(?=a)a", None),  # a lookahead: no example
        ("^(a)\\1$", None),  # a backreference: ecma_regex gives no translation
    ],
)
def test_pattern_examples_match_their_pattern(pattern, example) -> None:
    assert pattern_example(pattern) == example
    if example is not None:
        assert re.search(pattern, example)


def test_nested_alternatives_are_each_written_once(monkeypatch) -> None:
    """Work linear in the pattern: a branch is not written again once chosen, which would
    double the work at each level of nesting ((((x|y0)|y1)|y2)...)."""
    from stemma.runtime.constrained import pattern_example as module

    calls = []
    write = module._write
    monkeypatch.setattr(module, "_write", lambda *a: calls.append(1) or write(*a))
    pattern = "x"
    for i in range(12):
        pattern = f"({pattern}|y{i})"
    assert module.pattern_example(pattern) == "x"
    assert len(calls) < 100  # 2 ** 12 calls and more, before


def test_a_long_repeat_gives_no_example_without_being_written() -> None:
    """A repeat past the example's length is refused before the string is built: a pattern
    such as a{100000000} costs no 100 MB."""
    tracemalloc.start()
    try:
        assert pattern_example("^x(a{100000000})?b{3}$") == "xbbb"  # the optional part left out
        assert pattern_example("^a{100000000}$") is None
        assert pattern_example("^(ab{20}){20}$") is None  # 420 characters
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


@pytest.fixture(scope="module")
def engine():
    with Engine("smollm2-135m", dtype="float32", kv_cache_mb=128) as e:
        yield e


def _no_closing_brackets(engine) -> dict[int, float]:
    """A bias that keeps the model itself from ever closing an array or an object."""
    vocab = engine.tokenizer.vocab_size
    return {t: -100.0 for t in range(vocab) if set(engine.tokenizer.decode([t])) & set("]}")}


def test_a_json_output_ends_valid_within_the_budget(engine) -> None:
    prompt = engine.apply_chat_template([{"role": "user", "content": "A shopping list as JSON."}])
    params = {"json_schema": json.dumps(SCHEMA), "max_new_tokens": 48, "temperature": 0}
    params["logit_bias"] = _no_closing_brackets(engine)
    out = engine.generate(prompt, params)
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    assert out["meta_info"]["closed_early"] is True
    assert out["meta_info"]["completion_tokens"] <= 48
    jsonschema.validate(json.loads(out["text"]), SCHEMA)
    cut = engine.generate(prompt, {**params, "close_early": False})
    assert cut["meta_info"]["finish_reason"] == {"type": "length", "length": 48}
    assert "closed_early" not in cut["meta_info"]
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut["text"])
    assert cut["text"].startswith(out["text"][: len(out["text"]) // 2])  # exact until it closed


def test_a_long_completion_is_taken_in_time(engine) -> None:
    """The shortest completion is about 100 tokens, longer than the last stretch of the budget
    where a search would once have begun: the first search comes early enough to see it."""
    prompt = engine.apply_chat_template([{"role": "user", "content": "Coffee orders as JSON."}])
    params = {"json_schema": json.dumps(ORDER), "max_new_tokens": 160, "temperature": 0}
    params["logit_bias"] = _no_closing_brackets(engine)
    out = engine.generate(prompt, params)
    assert out["meta_info"]["closed_early"] is True
    assert out["meta_info"]["completion_tokens"] <= 160
    jsonschema.validate(json.loads(out["text"]), ORDER)


def test_regex_constraints_are_not_closed_early_unless_asked(engine) -> None:
    params = {"regex": r"\[[0-9,]*\]", "max_new_tokens": 12, "temperature": 0}
    params["logit_bias"] = _no_closing_brackets(engine)
    out = engine.generate("Numbers: ", params)
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    assert not out["text"].endswith("]")
    closed = engine.generate("Numbers: ", {**params, "close_early": True})
    assert closed["meta_info"]["closed_early"] is True and closed["text"].endswith("]")


def test_an_unanchored_pattern_closes_through_its_example(engine) -> None:
    """The request carries its schema's pattern examples from the caller's side (found as it
    is made, not on the scheduler thread), and the search writes one to end the string: its
    content may close only once it holds STAMPED (llguidance reads the pattern unanchored)."""
    schema = {
        "type": "object",
        "properties": {"note": {"type": "string", "pattern": "STAMPED"}},
        "required": ["note"],
    }
    params = {"json_schema": json.dumps(schema), "max_new_tokens": 40, "temperature": 0}
    params |= {"logit_bias": _no_closing_brackets(engine), "grammar_backend": "llguidance"}
    prompt = engine.apply_chat_template([{"role": "user", "content": "A note as JSON."}])
    _, (req,) = engine._prepare(prompt, None, params, {})
    assert req.closing_examples == ("STAMPED",)
    out = engine.generate(prompt, params)
    assert out["meta_info"]["closed_early"] is True
    assert out["meta_info"]["completion_tokens"] <= 40
    jsonschema.validate(json.loads(out["text"]), schema)
    _, (plain,) = engine._prepare(prompt, None, {**params, "close_early": False}, {})
    assert plain.closing_examples == ()  # not looked for where nothing closes early


INVOICE = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "price": {"type": "number"},
                    "quantity": {"type": "integer"},
                },
                "required": ["name", "price", "quantity"],
            },
        }
    },
    "required": ["items"],
}


def _never_closing_the_array(engine, schema, ask: str, budgets) -> list[dict]:
    """Greedy outputs, one per budget, of a model kept from writing `]`: each must end valid
    within its budget."""
    vocab = engine.tokenizer.vocab_size
    bias = {t: -100.0 for t in range(vocab) if "]" in engine.tokenizer.decode([t])}
    prompt = engine.apply_chat_template([{"role": "user", "content": ask}])
    params = [
        {
            "json_schema": json.dumps(schema),
            "max_new_tokens": n,
            "temperature": 0,
            "logit_bias": bias,
            "grammar_backend": "llguidance",
        }
        for n in budgets
    ]
    outs = engine.generate([prompt] * len(params), params)
    for n, out in zip(budgets, outs):
        assert out["meta_info"]["completion_tokens"] <= n
        jsonschema.validate(json.loads(out["text"]), schema)
    return outs


def test_no_token_starts_an_item_that_would_not_fit(engine) -> None:
    """`},` after an item's last value lengthens the shortest completion from 2 tokens to
    more than a dozen at once (another item and its required keys), more than MARGIN covers:
    near the end such a token is allowed only where a completion still fits after it. Every
    budget from 34 to 47 ends valid (without the guard, 37 to 44 were cut)."""
    outs = _never_closing_the_array(engine, INVOICE, "An invoice as JSON.", range(34, 48))
    assert any(out["meta_info"].get("closed_early") for out in outs)


PEOPLE_KEYS = ("first_name", "last_name", "email", "city", "country", "phone")
PEOPLE = {
    "type": "object",
    "properties": {
        "people": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {k: {"type": "string"} for k in PEOPLE_KEYS},
                "required": list(PEOPLE_KEYS),
                "additionalProperties": False,
            },
        }
    },
    "required": ["people"],
    "additionalProperties": False,
}


def test_no_item_starts_that_would_not_fit_far_from_the_end(engine) -> None:
    """An item of six required keys lengthens the shortest completion by about 30 tokens at
    once: `},` is refused wherever no completion fits after it, also when the budget's slack
    is larger than a few tokens, so the model closes the array itself. Without that
    (refusing only within 16 tokens of the last completion found), each of these budgets
    was cut."""
    budgets = [70, 74, 78, 82, 116, 120, 124, 128, 132]
    _never_closing_the_array(engine, PEOPLE, "A list of people as JSON.", budgets)


class _Refusing(ClosingMatcher):
    """Early closing's veto alone, over a mask that allows `allowed`: refuses `refused`."""

    def __init__(self, allowed: set[int], refused: set[int]) -> None:
        self.allowed, self.refused, self.asked = allowed, refused, []

    def fill_mask(self, bitmask, row=None) -> None:
        words = bitmask[row].view(np.uint32)
        words[:] = 0
        for t in self.allowed:
            words[t // 32] |= np.uint32(1 << (t % 32))

    def refuses(self, token_id: int) -> bool:
        self.asked.append(token_id)
        return token_id in self.refused


def _sampled(matchers, logits, temperature=0.0, seed=None) -> list[int]:
    vocab = logits.shape[-1]
    eos = frozenset({0})
    processor = OutputProcessor(SimpleNamespace(eos_token_ids=eos), Sampler(vocab, eos), 64)
    params = SamplingParams(temperature=temperature, seed=seed)
    reqs = [
        SimpleNamespace(
            grammar=m,
            sampling=SamplingState.create(params, [], vocab),
            logprob=LogprobRequest(),
        )
        for m in matchers
    ]
    out, dead = processor.sample(reqs, logits)
    assert dead == {}
    return out.next_ids


def test_a_refused_token_is_sampled_again_without_it() -> None:
    """Greedy: the best token early closing does not refuse; a row whose every allowed token
    is refused keeps its first choice; a row without early closing is not asked."""
    logits = torch.tensor([[0.0, 5.0, 4.0, 3.0, 2.0, 1.0]] * 3)
    picky = _Refusing({1, 2, 3, 4}, {1, 2})
    stuck = _Refusing({1, 2}, {1, 2})
    assert _sampled([picky, stuck, None], logits) == [3, 1, 1]
    assert picky.asked == [1, 2, 3] and stuck.asked == [1, 2]


def test_a_refused_token_leaves_the_others_drawn_as_the_mask_gives() -> None:
    """Sampling: a refused token is never drawn, and the others keep their odds (here 1 : 1
    over 2,000 seeded draws, each a tenth of the mass the refused token held)."""
    logits = torch.tensor([[0.0, 3.0, 3.0 - math.log(9), 3.0 - math.log(9)]])
    counts = collections.Counter(
        _sampled([_Refusing({1, 2, 3}, {1})], logits, temperature=1.0, seed=s)[0]
        for s in range(2000)
    )
    assert counts[1] == 0 and counts[0] == 0
    assert abs(counts[2] - counts[3]) < 200  # 1000 each; sd of the difference about 45


def test_a_completion_longer_than_pythons_recursion_limit_is_found(closing_tokens) -> None:
    """A search runs up to 1,024 tokens deep (WINDOW): its stack is its own, not Python's,
    whose limit of 1,000 frames once failed the request's mask with a RecursionError."""
    schema = {
        "type": "object",
        "properties": {"v": {"type": "array", "items": {"type": "integer"}, "minItems": 380}},
        "required": ["v"],
    }
    c = stemma.Constraint(json_schema=schema, backend="llguidance")
    m = c.matcher().inner
    path = closing_path(m, 1024, closing_tokens, c.tokenizer)
    assert path is not None and len(path) > 900
    assert not m.is_final()  # left as it was
    jsonschema.validate(json.loads(c.tokenizer.decode(path)), schema)
    longer = {**schema, "properties": {"v": {**schema["properties"]["v"], "minItems": 600}}}
    c = stemma.Constraint(json_schema=longer, backend="llguidance")
    assert closing_path(c.matcher().inner, 1024, closing_tokens, c.tokenizer) is None


def _counting_searches(monkeypatch) -> list[int]:
    """The limits of closing.py's searches, in order, as they run."""
    import stemma.runtime.constrained.closing as closing

    limits: list[int] = []
    real = closing.closing_path

    def counted(m, limit, *args):
        limits.append(limit)
        return real(m, limit, *args)

    monkeypatch.setattr(closing, "closing_path", counted)
    return limits


def test_a_first_search_is_remembered_by_constraint_and_budget(monkeypatch, closing_tokens):
    """Every fresh matcher of a constraint starts in one state: the first search's outcome,
    found once, serves the next request with that constraint and budget, mask for mask the
    same as a search of its own; another budget or constraint searches again."""
    from stemma.runtime.constrained.closing import StartPaths

    limits = _counting_searches(monkeypatch)
    c = stemma.Constraint(json_schema=SCHEMA, backend="llguidance")
    vocab, paths = c.tokenizer.vocab_size, StartPaths()

    def closing(budget: int, key=("shop",), start=True) -> ClosingMatcher:
        remembered = (paths, key) if start else None
        inner = c.matcher().inner
        return ClosingMatcher(inner, budget, closing_tokens, c.tokenizer, (), remembered)

    def masks(m: ClosingMatcher) -> list[bytes]:
        """Each step's mask along the output early closing forces."""
        out = []
        while not m.is_finished():
            row = _allowed(m, vocab)
            out.append(row.tobytes())
            bits = np.unpackbits(row.view(np.uint8), bitorder="little")
            m.accept_token(int(np.flatnonzero(bits)[0]))
        return out

    own = masks(closing(12, start=False))
    assert len(limits) == 1 and len(own) <= 12  # the budget only just fits: forced at once
    assert masks(closing(12)) == own and len(limits) == 2
    assert masks(closing(12)) == own and len(limits) == 2  # remembered: no search
    assert masks(closing(13)) and len(limits) == 3  # another budget
    assert masks(closing(12, key=("other",))) == own and len(limits) == 4  # another key
    missed = closing(3)  # no completion fits: None is remembered too
    _allowed(missed, vocab)
    _allowed(closing(3), vocab)
    assert limits[4:] == [3]


def test_a_batch_sharing_a_schema_searches_from_the_start_once(engine, monkeypatch) -> None:
    """Eight requests with one schema and budget: one search from the start between them,
    and the same outputs as when each searched for itself."""
    from stemma.runtime.constrained.closing import StartPaths

    prompts = [
        engine.apply_chat_template([{"role": "user", "content": f"Shopping list {i} as JSON."}])
        for i in range(8)
    ]
    params = {"json_schema": json.dumps(SCHEMA), "max_new_tokens": 40, "temperature": 0}
    params["logit_bias"] = _no_closing_brackets(engine)
    limits = _counting_searches(monkeypatch)
    shared = engine.generate(prompts, params)
    from_start = limits.count(40)
    monkeypatch.setattr(StartPaths, "get", lambda self, key: (False, None))
    limits.clear()
    alone = engine.generate(prompts, params)
    assert from_start == 1 and limits.count(40) == 8
    assert [o["output_ids"] for o in shared] == [o["output_ids"] for o in alone]
    assert all(o["meta_info"]["closed_early"] for o in shared)
    for out in shared:
        jsonschema.validate(json.loads(out["text"]), SCHEMA)
