"""Stop regexes in linear time: the DFA search agrees with `re.search` on random patterns and
texts, refuses what has no finite automaton, and does bounded work on `(a+)+b`."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stemma.runtime.scheduler.stop_regex import (
    MAX_CACHED_NFA_STATES,
    MAX_DFA_STATES,
    RegexSearch,
    compile_stop_regex,
    match_start,
)

FLAG = "--max-stop-regex-states"


def first_match(pattern: str, text: str, max_states: int = 4096) -> str | None:
    """Feed `text` one character at a time, as single-character tokens would arrive; the
    matched text at the first character that ends a match."""
    nfa = compile_stop_regex(pattern, max_states, FLAG)
    search = RegexSearch(nfa)
    if search.feed("") == 0:
        return ""
    for end in range(1, len(text) + 1):
        if search.feed(text[end - 1]) is not None:
            return text[match_start(nfa, text, end) : end]
    return None


def re_first_match(pattern: str, text: str) -> str | None:
    """What the old check (`re.search` on the whole output after every character) stopped on."""
    for end in range(len(text) + 1):
        if (m := re.search(pattern, text[:end])) is not None:
            return m.group(0)
    return None


ATOMS = ["a", "b", ".", "[ab]", "[^a]", r"\d", r"\s", r"\w", "[a-c]", "(?:ab|b)", "x", "^"]


@st.composite
def patterns(draw, depth: int = 0) -> str:
    if depth >= 3 or draw(st.booleans()):
        return draw(st.sampled_from(ATOMS))
    kind = draw(st.sampled_from(["cat", "alt", "star", "plus", "opt", "count", "group", "lazy"]))
    inner = draw(patterns(depth + 1))
    if kind == "cat":
        return inner + draw(patterns(depth + 1))
    if kind == "alt":
        return f"(?:{inner}|{draw(patterns(depth + 1))})"
    if kind == "count":
        lo = draw(st.integers(0, 2))
        return f"(?:{inner}){{{lo},{lo + draw(st.integers(0, 2))}}}"
    if kind == "group":
        return f"({inner})"
    suffix = {"star": "*", "plus": "+", "opt": "?", "lazy": "*?"}[kind]
    return f"(?:{inner}){suffix}"


@settings(max_examples=400, deadline=None)
@given(patterns(), st.text(alphabet="ab1 \nx", max_size=12))
def test_dfa_search_agrees_with_re_search(pattern: str, text: str) -> None:
    assert first_match(pattern, text) == re_first_match(pattern, text)


@settings(max_examples=10, deadline=None)
@given(st.text(alphabet="ab0129.-: @\nHhe", max_size=20))
def test_dfa_search_agrees_on_the_constraint_corpus(regex_corpus: list[str], text: str) -> None:
    for pattern in regex_corpus:
        assert first_match(pattern, text) == re_first_match(pattern, text)


@pytest.mark.parametrize(
    ("pattern", "text", "expected"),
    [
        ("(?m)^b", "ab\nb", "b"),
        ("^b", "ab\nb", None),
        (r"\Aa", "aa", "a"),
        ("(?s)a.b", "a\nb", "a\nb"),
        ("a.b", "a\nb", None),
        ("(?i)AB", "xab", "ab"),
        ("a*", "bbb", ""),
        ("(a|ab)(c|bcd)", "abcd", "abc"),
        ("[\u4e00-\u9fff]{2}", "x你好", "你好"),
    ],
)
def test_flags_anchors_and_unicode(pattern: str, text: str, expected: str | None) -> None:
    assert first_match(pattern, text) == expected


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        (r"(a)\1", "backreferences"),
        ("(?=a)b", "lookaround"),
        ("(?<!a)b", "lookaround"),
        ("a$", "end anchors"),
        (r"\bword", "word boundaries"),
        ("(?>a+)b", "atomic"),
        ("a++b", "possessive"),
        ("(a)?(?(1)b|c)", "conditional"),
        ("(ab", "does not compile"),
    ],
)
def test_refuses_what_has_no_finite_automaton_naming_the_pattern(pattern: str, words: str) -> None:
    with pytest.raises(ValueError) as e:
        compile_stop_regex(pattern, 4096, FLAG)
    assert repr(pattern) in str(e.value) and words in str(e.value)


@pytest.mark.parametrize("pattern", ["(a{1000}){1000}", "(?:){4000000000}", "((?:){999}){999}"])
def test_automaton_size_is_bounded_and_names_the_flag(pattern: str) -> None:
    with pytest.raises(ValueError, match=r"more than 1000 automaton states.*--max-stop-regex"):
        compile_stop_regex(pattern, 1000, FLAG)


def test_dfa_cache_memory_is_bounded_on_a_state_explosion() -> None:
    """`[ab]*a[ab]{40}` has 2^40 DFA states; the cache starts over instead of growing, and
    the search still finds the match."""
    search = RegexSearch(compile_stop_regex("c[ab]*a[ab]{40}d", 4096, FLAG))
    text = "c" + "".join("ab"[(i * i + i // 3) % 2] for i in range(3000)) + "a" + "b" * 40
    assert search.feed(text) is None
    assert len(search._sets) <= MAX_DFA_STATES
    assert search._num_cached <= MAX_CACHED_NFA_STATES + 100
    assert search.feed("d") == 1 and search.num_built > 0


def test_nested_quantifiers_cost_bounded_work_per_character() -> None:
    """`(a+)+b` over a run of a's is exponential for a backtracking engine; here each new
    character costs one cached transition once the few DFA states exist."""
    search = RegexSearch(compile_stop_regex("(a+)+b", 4096, FLAG))
    for _ in range(10_000):
        assert search.feed("a") is None
    built_after_warmup = search.num_built
    assert built_after_warmup < 50
    assert search.feed("a" * 10_000) is None
    assert search.num_built == built_after_warmup  # no new work: every transition was cached
    assert search.feed("ab") == 2


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from stemma.runtime.tokenizer import Tokenizer

    return Tokenizer(tiny_llama_dir)


def reference_stop(stops: list[str], regexes: list[str], text: str) -> str | None:
    """The first character that completes a stop string or a regex match decides; a string
    wins a tie, then list order; a regex reports what re.search finds up to there."""
    for end in range(len(text) + 1):
        for s in stops:
            if s in text[:end]:
                return s
        for pattern in regexes:
            if (m := re.search(pattern, text[:end])) is not None:
                return m.group(0)
    return None


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(["fox", "o", "z", "lazy dog", "\n"]), max_size=2),
    st.lists(st.sampled_from([r"o\w", "[aeiou]{2}", "qu+", r"\d", "(?m)^T", "zz"]), max_size=2),
    st.lists(st.integers(1, 4), min_size=1, max_size=40),
)
def test_matcher_over_token_chunks_agrees_with_the_reference(tokenizer, stops, regexes, chunks):
    from stemma.runtime.sampling.params import SamplingParams
    from stemma.runtime.scheduler.stop import StopSpec

    text = "The quick brown fox jumps over the lazy dog.\nThe 42 numbers"
    ids = tokenizer.encode(text)
    spec = StopSpec.compile(SamplingParams(stop=stops, stop_regex=regexes))
    expected = reference_stop(stops, regexes, text)
    if spec is None:
        assert expected is None
        return
    matcher, seen, got = spec.matcher(tokenizer), 0, None
    for size in chunks * (len(ids) // len(chunks) + 1):
        seen = min(seen + size, len(ids))
        if (got := matcher.feed(ids[:seen])) is not None or seen == len(ids):
            break
    assert got == expected


def hold_back_by_rescan(text: str, stops: list[str]) -> str:
    """The stream's former hold-back, rescanning the whole text on every update."""
    cut = len(text)
    for s in stops:
        if (idx := text.find(s)) >= 0:
            cut = min(cut, idx)
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                cut = min(cut, len(text) - k)
                break
    return text[:cut]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.text(alphabet="ab", min_size=1, max_size=5), min_size=1, max_size=3),
    st.lists(st.text(alphabet="abc", max_size=4), max_size=12),
)
def test_stream_hold_back_advances_per_character_and_agrees_with_a_rescan(stops, pieces):
    from stemma.runtime.scheduler.stop import StopPrefixes

    held, text = StopPrefixes(stops), ""
    for piece in pieces:
        text += piece
        assert text[: held.shown(text)] == hold_back_by_rescan(text, stops)
