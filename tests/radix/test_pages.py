"""The slice-based helpers agree with token-by-token definitions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from stemma.radix.pages import common_prefix_len, dup_slots, num_page_slots, whole_pages

tokens = st.lists(st.integers(0, 2), max_size=300)


@given(tokens, tokens, st.integers(0, 300))
def test_common_prefix_len_matches_a_plain_loop(
    edge: list[int], seq: list[int], start: int
) -> None:
    start = min(start, len(seq))
    expected = 0
    while expected < min(len(edge), len(seq) - start) and edge[expected] == seq[start + expected]:
        expected += 1
    assert common_prefix_len(edge, seq, start) == expected


@given(st.integers(1, 8), st.integers(1, 50), st.integers(1, 40), st.data())
def test_dup_slots_are_the_callers_differing_pages(
    page_size: int, first_page: int, num_tokens: int, data: st.DataObject
) -> None:
    num_pages = -(-num_tokens // page_size)
    given_pages = [first_page + p for p in range(num_pages)]
    same = data.draw(st.lists(st.booleans(), min_size=num_pages, max_size=num_pages))
    cached_pages = [g if s else g + 1000 for g, s in zip(given_pages, same, strict=True)]

    def expand(pages: list[int]) -> list[int]:
        return [p * page_size + j for p in pages for j in range(page_size)]

    given_slots, cached_slots = expand(given_pages)[:num_tokens], expand(cached_pages)[:num_tokens]
    differing = [g for g, s in zip(given_pages, same, strict=True) if not s]
    assert dup_slots(given_slots, cached_slots, page_size) == expand(differing)
    assert whole_pages(given_slots, page_size) == expand(given_pages)
    assert num_page_slots(num_tokens, page_size) == num_pages * page_size
