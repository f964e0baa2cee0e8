"""Constraint regexes match exactly what they promise; parsed values have the Python type."""

from __future__ import annotations

import json
import re

import pytest
from stemma.lang.constraints import (
    REGEX_BOOL,
    REGEX_FLOAT,
    REGEX_INT,
    REGEX_STR,
    choices_regex,
    parse_value,
    schema_to_regex,
)


def test_choices_regex_matches_exactly_the_choices():
    choices = ["a+b", "(x)", "1.5", "what?", "yes|no", "a b", "ünï"]
    pattern = re.compile(choices_regex(choices))
    assert all(pattern.fullmatch(c) for c in choices)
    assert not any(pattern.fullmatch(t) for t in ["aab", "x", "105", "what", "yes", "ab"])


@pytest.mark.parametrize(
    ("regex", "good", "bad"),
    [
        (REGEX_INT, ["0", "-7", "1234"], ["01", "1.0", "+", ""]),
        (REGEX_FLOAT, ["0", "-2.5", "1e-3", "3.0E4"], ["1.", ".5", "e3", "--1"]),
        (REGEX_BOOL, ["True", "False"], ["true", "1"]),
        (REGEX_STR, ['""', '"a b"', '"q\\"t"', '"\\u00e9"'], ['"a', 'a"', '"\n"', '"\\x"']),
    ],
)
def test_dtype_regexes(regex, good, bad):
    assert all(re.fullmatch(regex, text) for text in good)
    assert not any(re.fullmatch(regex, text) for text in bad)


def test_parse_value_converts_and_names_bad_text():
    assert parse_value("-3", int) == -3
    assert parse_value("1e2", float) == 100.0
    assert parse_value("False", bool) is False
    assert parse_value('"a\\nb', str) == '"a\\nb'  # str keeps the raw text, as SGLang
    assert parse_value("raw", None) == "raw"
    with pytest.raises(ValueError, match="'abc' is not a valid int"):
        parse_value("abc", int)


def test_schema_to_regex_matches_valid_documents():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    regex = schema_to_regex(schema)
    assert re.fullmatch(regex, json.dumps({"n": 12}))
    assert not re.fullmatch(regex, json.dumps({"n": "12"}))
