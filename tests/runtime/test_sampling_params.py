"""SamplingParams: SGLang defaults, normalization, and 400-worthy errors that name the field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from stemma.runtime.sampling.params import SamplingParams

SGLANG_FIELDS = {
    "max_new_tokens",
    "min_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "n",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "logit_bias",
    "seed",
    "sampling_seed",
    "regex",
    "json_schema",
    "ebnf",
    "structural_tag",
    "custom_params",
    "stream_interval",
}


def test_defaults_are_sglangs() -> None:
    p = SamplingParams.from_dict(None)
    assert p == SamplingParams.from_dict({}) == SamplingParams()
    assert (p.max_new_tokens, p.min_new_tokens, p.n) == (128, 0, 1)
    assert (p.temperature, p.top_p, p.top_k, p.min_p) == (1.0, 1.0, -1, 0.0)
    assert (p.frequency_penalty, p.presence_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.ignore_eos, p.skip_special_tokens, p.spaces_between_special_tokens) == (
        False,
        True,
        True,
    )
    assert (p.stop, p.stop_token_ids, p.stop_regex, p.logit_bias) == ([], [], [], {})
    assert (p.seed, p.regex, p.json_schema, p.ebnf, p.no_stop_trim) == (
        None,
        None,
        None,
        None,
        False,
    )
    assert p.is_greedy is False


def test_every_sglang_field_accepted_and_null_means_default() -> None:
    p = SamplingParams.from_dict({name: None for name in SGLANG_FIELDS})
    assert p == SamplingParams()


@pytest.mark.parametrize(
    ("given", "name", "expected"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens", 0),
        ({"min_new_tokens": 4, "max_new_tokens": 4}, "min_new_tokens", 4),
        ({"stop": "\n"}, "stop", ["\n"]),
        ({"stop": ["a", "bc"]}, "stop", ["a", "bc"]),
        ({"stop_token_ids": [7, 3, 7]}, "stop_token_ids", [3, 7]),
        ({"stop_regex": r"\d+"}, "stop_regex", [r"\d+"]),
        ({"temperature": 0}, "temperature", 0.0),
        ({"temperature": 2}, "temperature", 2.0),
        ({"top_p": 0.5}, "top_p", 0.5),
        ({"top_k": 0}, "top_k", 0),
        ({"top_k": 40}, "top_k", 40),
        ({"min_p": 1}, "min_p", 1.0),
        ({"frequency_penalty": -2}, "frequency_penalty", -2.0),
        ({"presence_penalty": 2.0}, "presence_penalty", 2.0),
        ({"repetition_penalty": 2}, "repetition_penalty", 2.0),
        ({"n": 3}, "n", 3),
        ({"ignore_eos": True}, "ignore_eos", True),
        ({"logit_bias": {"5": 1, 9: -100.0}}, "logit_bias", {5: 1.0, 9: -100.0}),
        ({"seed": 0}, "seed", 0),
        ({"sampling_seed": 42}, "seed", 42),
        ({"seed": 42, "sampling_seed": 42}, "seed", 42),
        ({"regex": "[ab]+"}, "regex", "[ab]+"),
        ({"json_schema": {"type": "object"}}, "json_schema", '{"type": "object"}'),
        ({"json_schema": '{"type": "string"}'}, "json_schema", '{"type": "string"}'),
        ({"ebnf": 'root ::= "a"'}, "ebnf", 'root ::= "a"'),
        ({"custom_params": {"k": [1, "x"]}}, "custom_params", {"k": [1, "x"]}),
        ({"stream_interval": 4}, "stream_interval", 4),
    ],
)
def test_good_values_normalize(given: dict[str, Any], name: str, expected: object) -> None:
    p = SamplingParams.from_dict(given)
    assert getattr(p, name) == expected
    assert type(getattr(p, name)) is type(expected)


@pytest.mark.parametrize(
    ("given", "error", "fragments"),
    [
        ({"max_new_token": 5}, ValueError, ["'max_new_token'", "max_new_tokens", "temperature"]),
        ({"max_new_tokens": -1}, ValueError, ["max_new_tokens", "-1", ">= 0"]),
        ({"max_new_tokens": 1.5}, TypeError, ["max_new_tokens", "1.5", "integer"]),
        ({"max_new_tokens": True}, TypeError, ["max_new_tokens", "True", "integer"]),
        ({"min_new_tokens": 9, "max_new_tokens": 8}, ValueError, ["min_new_tokens", "9", "<= "]),
        ({"stop": ""}, ValueError, ["stop", "''", "non-empty"]),
        ({"stop": ["a", 3]}, TypeError, ["stop", "3", "strings"]),
        ({"stop_token_ids": [1, -2]}, ValueError, ["stop_token_ids", "-2", ">= 0"]),
        ({"stop_token_ids": "12"}, TypeError, ["stop_token_ids", "'12'", "list"]),
        ({"stop_regex": "(a"}, ValueError, ["stop_regex", "'(a'", "regular expression"]),
        ({"temperature": -0.1}, ValueError, ["temperature", "-0.1", ">= 0"]),
        ({"temperature": "hot"}, TypeError, ["temperature", "'hot'", "number"]),
        ({"temperature": False}, TypeError, ["temperature", "False", "number"]),
        ({"temperature": float("nan")}, ValueError, ["temperature", "nan", "finite"]),
        ({"top_p": 0}, ValueError, ["top_p", "0", "(0, 1]"]),
        ({"top_p": 1.01}, ValueError, ["top_p", "1.01", "(0, 1]"]),
        ({"top_k": -2}, ValueError, ["top_k", "-2", "-1"]),
        ({"min_p": 1.5}, ValueError, ["min_p", "1.5", "[0, 1]"]),
        ({"frequency_penalty": 2.5}, ValueError, ["frequency_penalty", "2.5", "[-2, 2]"]),
        ({"presence_penalty": -3}, ValueError, ["presence_penalty", "-3", "[-2, 2]"]),
        ({"repetition_penalty": 0}, ValueError, ["repetition_penalty", "0", "(0, 2]"]),
        ({"repetition_penalty": 2.1}, ValueError, ["repetition_penalty", "2.1", "(0, 2]"]),
        ({"n": 0}, ValueError, ["n", "0", ">= 1"]),
        ({"ignore_eos": "yes"}, TypeError, ["ignore_eos", "'yes'", "true or false"]),
        ({"logit_bias": {"x": 1}}, TypeError, ["logit_bias", "'x'", "token id"]),
        ({"logit_bias": {"-1": 1}}, ValueError, ["logit_bias", "'-1'", ">= 0"]),
        ({"logit_bias": {"3": 101}}, ValueError, ["logit_bias", "101", "[-100, 100]"]),
        ({"logit_bias": [1, 2]}, TypeError, ["logit_bias", "[1, 2]", "token_id"]),
        ({"seed": -1}, ValueError, ["seed", "-1", "[0, "]),
        ({"seed": "7"}, TypeError, ["seed", "'7'", "integer"]),
        ({"seed": 1, "sampling_seed": 2}, ValueError, ["sampling_seed", "2", "seed=1"]),
        ({"regex": 5}, TypeError, ["regex", "5", "string"]),
        ({"json_schema": "{not json"}, ValueError, ["json_schema", "'{not json'", "JSON"]),
        ({"json_schema": 3}, TypeError, ["json_schema", "3", "JSON"]),
        ({"regex": "a", "json_schema": {}}, ValueError, ["regex", "json_schema", "at most one"]),
        ({"regex": "a", "ebnf": "r"}, ValueError, ["regex", "ebnf", "at most one"]),
        ({"custom_params": [1]}, TypeError, ["custom_params", "[1]", "object"]),
        ({"stream_interval": 0}, ValueError, ["stream_interval", "0", ">= 1"]),
    ],
)
def test_bad_values_name_field_value_and_allowed(
    given: dict[str, Any], error: type[Exception], fragments: list[str]
) -> None:
    with pytest.raises(error) as info:
        SamplingParams.from_dict(given)
    message = str(info.value)
    assert [f for f in fragments if f not in message] == []


def test_not_a_dict_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="sampling_params must be an object"):
        SamplingParams.from_dict([{"temperature": 0}])  # type: ignore[arg-type]


def test_direct_construction_is_validated_too() -> None:
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    assert SamplingParams(stop="x").stop == ["x"]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "is_greedy"),
    [({"temperature": 0}, True), ({"top_k": 1}, True), ({"top_k": 2}, False), ({}, False)],
)
def test_is_greedy(given: dict[str, Any], is_greedy: bool) -> None:
    assert SamplingParams.from_dict(given).is_greedy is is_greedy


def test_to_dict_round_trips_through_json() -> None:
    p = SamplingParams.from_dict(
        {
            "stop": "x",
            "stop_token_ids": [4],
            "logit_bias": {"2": 0.5},
            "json_schema": {"type": "integer"},
            "seed": 3,
            "custom_params": {"a": 1},
        }
    )
    d = p.to_dict()
    assert SamplingParams.from_dict(d) == p
    assert SamplingParams.from_dict(json.loads(json.dumps(d))) == p
    d["stop"].append("y")
    assert p.stop == ["x"]


def test_check_vocab_rejects_out_of_range_ids() -> None:
    SamplingParams.from_dict({"stop_token_ids": [9], "logit_bias": {"9": 1}}).check_vocab(10)
    with pytest.raises(
        ValueError, match=r"stop_token_ids must be token ids in \[0, 9\], got \[10\]"
    ):
        SamplingParams.from_dict({"stop_token_ids": [3, 10]}).check_vocab(10)
    with pytest.raises(ValueError, match=r"logit_bias .*\[12\]"):
        SamplingParams.from_dict({"logit_bias": {"12": 1.0}}).check_vocab(10)


# One bad value per checked field: lang's gen/run and the runtime must refuse each alike.
BAD_VALUES = [
    ("max_new_tokens", -1),
    ("min_new_tokens", 1.5),
    ("stop", ""),
    ("stop_token_ids", [-3]),
    ("stop_regex", "(a"),
    ("temperature", -0.5),
    ("top_p", 0.0),
    ("top_k", -2),
    ("min_p", 2.0),
    ("frequency_penalty", 3.0),
    ("presence_penalty", "x"),
    ("repetition_penalty", 3.0),
    ("n", 0),
    ("ignore_eos", "yes"),
    ("seed", -1),
    ("regex", 5),
    ("json_schema", "{not json"),
]


@pytest.mark.parametrize(("name", "value"), BAD_VALUES)
def test_lang_refuses_what_the_runtime_refuses_with_its_message(name: str, value: Any) -> None:
    from stemma.lang.sampling import SamplingParams as LangParams

    with pytest.raises((TypeError, ValueError)) as runtime_error:
        SamplingParams.from_dict({name: value})
    with pytest.raises(type(runtime_error.value)) as lang_error:
        LangParams(**{name: value})
    assert str(lang_error.value) == str(runtime_error.value)


def test_a_bad_run_default_fails_at_run_not_at_the_backend() -> None:
    """run(repetition_penalty=3.0) once passed lang and failed at the runtime."""
    from stemma.lang import function, gen

    @function
    def prog(s):
        s += "x" + gen("y", max_tokens=2)

    with pytest.raises(ValueError, match=r"sampling_params.repetition_penalty must be in \(0, 2\]"):
        prog.run(backend=None, repetition_penalty=3.0)
    with pytest.raises(ValueError, match=r"sampling_params.repetition_penalty must be in \(0, 2\]"):
        gen("y", repetition_penalty=3.0)


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"min_new_tokens": 5, "max_new_tokens": 4}, "min_new_tokens must be <= max_new_tokens"),
        ({"regex": "a", "json_schema": "{}"}, "at most one of"),
    ],
)
def test_joined_rules_hold_on_both_sides(values: dict[str, Any], fragment: str) -> None:
    from stemma.lang.sampling import SamplingParams as LangParams

    for build in (SamplingParams.from_dict, lambda v: LangParams(**v)):
        with pytest.raises(ValueError, match=fragment):
            build(values)
