"""Constrained decoding through the Engine on the built-in model: every output of the
corpus fullmatches its regex or validates against its schema (greedy and seeded sampling,
jump-forward on and off, in batches mixed with unconstrained requests); bad constraints fail
only their own request."""

from __future__ import annotations

import json
import re
import threading
import uuid

import jsonschema
import pytest
from stemma.runtime.constrained.spec import ConstraintSpec
from stemma.runtime.engine import Engine

MAX_NEW = 160


def bounded(regex: str, most: int = 6) -> str:
    """`regex` with every unbounded `*` / `+` capped at `most` repeats.

    The model decides when to stop, and a 135M model under an unbounded pattern may loop
    ("1.1111...") until max_new_tokens; capped repeats make every output a complete match."""
    out, i, in_class = [], 0, False
    while i < len(regex):
        ch = regex[i]
        if ch == "\\":
            out.append(regex[i : i + 2])
            i += 2
            continue
        if ch == "[" and not in_class:
            in_class = True
        elif ch == "]" and in_class:
            in_class = False
        elif not in_class and ch in "*+":
            ch = f"{{0,{most}}}" if ch == "*" else f"{{1,{most}}}"
        out.append(ch)
        i += 1
    return "".join(out)


@pytest.fixture(scope="module")
def engines():
    # dtype "auto": bfloat16 where the CPU runs it natively, float32 elsewhere.
    on = Engine("smollm2-135m", kv_cache_mb=256)
    off = Engine("smollm2-135m", kv_cache_mb=256, enable_jump_forward=False)
    on.check_invariants = off.check_invariants = True
    yield {True: on, False: off}
    on.shutdown()
    off.shutdown()


def prompt(engine: Engine, what: str) -> str:
    return engine.apply_chat_template([{"role": "user", "content": what}])


def run_corpus(engine, constraints: list[dict], extra: dict) -> list[dict]:
    """One batch: every constrained request plus two unconstrained ones in between."""
    texts = [prompt(engine, c.pop("_ask")) for c in constraints]
    params = [{**c, "max_new_tokens": MAX_NEW, **extra} for c in constraints]
    texts += [prompt(engine, "Tell me a fact."), prompt(engine, "Count to ten.")]
    params += [{"max_new_tokens": 20, **extra}, {"max_new_tokens": 20, **extra}]
    return engine.generate(texts, params)[: len(constraints)]


def regex_requests(regex_corpus) -> list[dict]:
    return [{"regex": bounded(r), "_ask": f"Write one example matching {r}"} for r in regex_corpus]


def engine_schemas(schema_corpus) -> list[dict]:
    """The corpus minus schemas using `format` (email has no length bound there, so a 135M
    model can loop inside it; the grammar unit tests cover formats with a fake model)."""
    schemas = [s for s in schema_corpus if '"format"' not in json.dumps(s)]
    assert len(schemas) >= 10
    return schemas


def schema_requests(schemas) -> list[dict]:
    return [
        {
            "json_schema": json.dumps(s),
            "_ask": "Reply with a JSON object for this schema: " + json.dumps(s),
        }
        for s in schemas
    ]


# Greedy, and sampling at temperature 1 (the widest distribution a request normally asks for).
SAMPLING = [{"temperature": 0}, {"temperature": 1.0, "seed": 7}]


@pytest.mark.parametrize("jump_forward", [True, False])
@pytest.mark.parametrize("sampling", SAMPLING, ids=["greedy", "seed7"])
def test_regex_corpus_outputs_fullmatch(engines, regex_corpus, jump_forward, sampling):
    outs = run_corpus(engines[jump_forward], regex_requests(regex_corpus), sampling)
    for pattern, out in zip(regex_corpus, outs):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", (pattern, out)
        assert re.fullmatch(bounded(pattern), out["text"]), (pattern, out["text"])
        assert re.fullmatch(pattern, out["text"]), (pattern, out["text"])


def test_bounded_caps_only_unbounded_quantifiers():
    assert bounded(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?[-+*]c\+d") == (
        r"-?(0|[1-9][0-9]{0,6})(\.[0-9]{1,6})?[-+*]c\+d"
    )


@pytest.mark.parametrize("jump_forward", [True, False])
@pytest.mark.parametrize("sampling", SAMPLING, ids=["greedy", "seed7"])
def test_schema_corpus_outputs_validate(engines, schema_corpus, jump_forward, sampling):
    """JSON numbers have no length bound, so a model may run into max_new_tokens inside
    one; such an output is closed early (valid, ended up to 8 tokens before the budget; which
    outputs get there can change with the batch's shapes in bfloat16) or else must still be a
    prefix the constraint allows, and nearly all finish."""
    engine = engines[jump_forward]
    schemas = engine_schemas(schema_corpus)
    outs = run_corpus(engine, schema_requests(schemas), sampling)
    complete = 0
    for schema, out in zip(schemas, outs):
        if out["meta_info"]["finish_reason"]["type"] == "stop" or out["meta_info"].get(
            "closed_early"
        ):
            jsonschema.validate(json.loads(out["text"]), schema)
            complete += 1
        else:
            assert out["meta_info"]["completion_tokens"] == MAX_NEW
            assert_allowed_prefix(engine, json.dumps(schema), out["output_ids"])
    assert complete >= len(schemas) - 1


def assert_allowed_prefix(engine: Engine, schema: str, ids: list[int]) -> None:
    handle = engine.constraints.service.submit(ConstraintSpec.create(json_schema=schema))
    assert handle.wait(60)
    matcher = handle.matcher()
    for t in ids:
        matcher.accept_token(t)  # raises if the constraint never allowed it


@pytest.mark.parametrize("backend", ["outlines", "llguidance"])
def test_jump_forward_keeps_greedy_output(schema_corpus, regex_corpus, backend):
    """Greedy text is the same with jump-forward on and off; on forwards fewer times, with
    either grammar backend (llguidance's forced tokens, and early closing, on by default for
    a json_schema, beside them). float64 so that the different step shapes cannot flip a
    near-tie. A float64 step of the built-in model is slow on every CPU, so the prompts are
    short and outputs stop at 24 tokens: enough for the forced keys of the first schemas to be
    jumped over."""
    reqs = [{"json_schema": json.dumps(s)} for s in engine_schemas(schema_corpus)[:4]]
    reqs += [{"regex": bounded(r)} for r in regex_corpus[:2]]
    texts, steps = {}, {}
    for jf in (True, False):
        with Engine(
            "smollm2-135m",
            dtype="float64",
            kv_cache_mb=64,
            enable_jump_forward=jf,
            grammar_backend=backend,
        ) as engine:
            asks = [
                prompt(engine, "Reply with JSON." if "json_schema" in r else "Reply.") for r in reqs
            ]
            params = [{**r, "max_new_tokens": 24, "temperature": 0} for r in reqs]
            texts[jf] = [o["text"] for o in engine.generate(asks, params)]
            steps[jf] = engine.get_metrics()["num_steps"]
    assert texts[True] == texts[False]
    assert steps[True] < steps[False]


def test_bad_constraints_fail_only_their_request(engines):
    engine = engines[True]
    results: dict[str, object] = {}

    def normal() -> None:
        results["normal"] = engine.generate(
            prompt(engine, "Say hello."), {"max_new_tokens": 24, "temperature": 0}
        )

    t = threading.Thread(target=normal)
    t.start()
    with pytest.raises(ValueError, match="invalid regex"):
        engine.generate("x", {"regex": "(ab"})
    with pytest.raises(ValueError, match="lookahead"):
        engine.generate("x", {"regex": "(?=a)b"})
    two = [{"type": "array", "uniqueItems": True}, {"type": "array", "maxItems": 2}]
    with pytest.raises(ValueError, match="uniqueItems"):  # refused by both backends
        engine.generate("x", {"json_schema": json.dumps({"anyOf": two})})
    t.join()
    assert results["normal"]["meta_info"]["finish_reason"]["type"] in ("stop", "length")


def test_constraint_over_compile_limit_fails_that_request_only():
    """A compile past the time limit (the hang switch, whatever this CPU's speed) fails its
    own request; the one beside it and the next one run."""
    name = f"s{uuid.uuid4().hex}"  # never in the disk cache of compiled constraints
    huge = {
        "type": "object",
        "properties": {name: {"type": "string", "maxLength": 400}},
        "required": [name],
    }
    with Engine(
        "smollm2-135m", kv_cache_mb=128, grammar_timeout_s=0.5, enable_fault_injection=True
    ) as engine:
        engine.inject_fault("compile_hang")
        outs = engine.generate(
            [prompt(engine, "Write JSON."), prompt(engine, "Say hi.")],
            [
                {"json_schema": json.dumps(huge), "max_new_tokens": 16},
                {"max_new_tokens": 8, "temperature": 0},
            ],
        )
        again = engine.generate(prompt(engine, "Say hi."), {"max_new_tokens": 8})
    failed, fine = outs
    assert failed["meta_info"]["finish_reason"]["type"] == "abort"
    assert "constraint" in failed["meta_info"]["finish_reason"]["message"]
    assert fine["meta_info"]["finish_reason"]["type"] in ("stop", "length")
    assert again["meta_info"]["completion_tokens"] > 0
