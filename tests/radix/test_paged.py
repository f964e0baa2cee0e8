"""Scenarios at page_size 4: page-aligned edges and matches, whole-page eviction, and the
partial last page that a later request takes over instead of recomputing."""

from __future__ import annotations

import pytest
from stemma.radix import InsertResult, RadixTree

PS = 4
TURN1 = list(range(100, 110))  # 10 tokens: pages 1, 2 full, page 3 holds 2 of 4
TURN1_SLOTS = list(range(4, 14))
TURN2 = TURN1 + [200, 201, 202, 203, 204]


def page(p: int) -> list[int]:
    return list(range(p * PS, p * PS + PS))


def chat_tree() -> RadixTree:
    tree = RadixTree(page_size=PS)
    assert tree.insert(TURN1, TURN1_SLOTS) == InsertResult(0, [])
    tree.check_invariants()
    return tree


def test_partial_last_page_is_kept_and_accounted_as_a_whole_page() -> None:
    tree = chat_tree()
    assert (tree.total_size, tree.evictable_size, tree.locked_size) == (10, 12, 0)
    assert list(tree.sequences()) == [(None, TURN1, TURN1_SLOTS)]


def test_match_is_page_aligned_and_never_returns_a_partial_page() -> None:
    tree = chat_tree()
    slots, node = tree.match_prefix(TURN2)
    tree.check_invariants()
    assert slots == page(1) + page(2)
    assert node.key == TURN1[:8]
    assert [child.key for child in node.children.values()] == [[108, 109]]
    assert list(node.children) == [(108, 109)]  # a partial page is filed under its tokens
    assert tree.match_prefix(TURN1[:7]).slots == page(1)


def test_split_is_page_aligned() -> None:
    tree = RadixTree(page_size=PS)
    tree.insert(list(range(8)), page(1) + page(2))
    slots, node = tree.match_prefix([0, 1, 2, 3, 4, 5, 99, 7])
    assert (slots, node.key) == (page(1), [0, 1, 2, 3])
    assert tree.insert([0, 1, 2, 3, 4, 5, 6, 77], page(5) + page(6)) == InsertResult(4, page(5))
    tree.check_invariants()
    assert sorted(node.children) == [(4, 5, 6, 7), (4, 5, 6, 77)]
    assert sorted(tree.sequences()) == [
        (None, [0, 1, 2, 3, 4, 5, 6, 7], page(1) + page(2)),
        (None, [0, 1, 2, 3, 4, 5, 6, 77], page(1) + page(6)),
    ]
    assert tree.evictable_size == 12


def test_evict_returns_whole_pages_including_a_partial_pages_tail() -> None:
    tree = chat_tree()
    tree.match_prefix(TURN1)  # splits off the partial page [108, 109]
    assert tree.evict(1) == page(3)
    assert tree.evict(1) == page(1) + page(2)
    assert (tree.total_size, tree.evictable_size) == (0, 0)
    tree.check_invariants()


def test_request_that_extends_a_partial_page_takes_it_over() -> None:
    tree = chat_tree()
    slots, node = tree.match_prefix(TURN2)
    tree.lock(node)
    claimed = tree.claim_partial_page(node, TURN2[len(slots) :])
    tree.check_invariants()
    assert claimed == [12, 13]
    # Page 3 is now the request's own: the tree holds 8 locked slots and nothing else.
    assert (tree.total_size, tree.locked_size, tree.evictable_size) == (8, 8, 0)
    assert tree.evict(100) == []
    # It writes 200, 201 into slots 14, 15 (the rest of page 3) and 202..204 into page 4:
    # 10 cached tokens reused, where aligned-only reuse would recompute 108 and 109.
    req_slots = slots + claimed + [14, 15] + [16, 17, 18]
    assert tree.insert(TURN2, req_slots) == InsertResult(8, [])
    tree.unlock(node)
    tree.check_invariants()
    assert list(tree.sequences()) == [(None, TURN2, list(range(4, 19)))]
    assert (tree.total_size, tree.evictable_size) == (15, 16)
    assert tree.num_hit_tokens == 10


def test_a_claimed_page_has_one_owner() -> None:
    tree = chat_tree()
    slots_a, node_a = tree.match_prefix(TURN2)
    assert tree.claim_partial_page(node_a, TURN2[8:]) == [12, 13]
    # A second request extending the same page now recomputes 108, 109 into a page of its own.
    slots_b, node_b = tree.match_prefix(TURN1 + [300])
    assert (slots_b, node_b) == (slots_a, node_a)
    assert tree.claim_partial_page(node_b, [108, 109, 300]) == []


def test_claim_takes_the_longest_partial_page_the_request_covers() -> None:
    tree = RadixTree(page_size=PS)
    tree.insert([1, 2], page(1)[:2])
    tree.insert([1, 2, 3], page(2)[:3])
    tree.insert([1, 9], page(3)[:2])
    _, root = tree.match_prefix([])
    assert tree.claim_partial_page(root, [1, 2, 3, 4, 5]) == page(2)[:3]
    assert tree.claim_partial_page(root, [1, 2, 3, 4, 5]) == page(1)[:2]
    assert tree.claim_partial_page(root, [1, 2, 3, 4, 5]) == []
    assert list(tree.sequences()) == [(None, [1, 9], page(3)[:2])]
    tree.check_invariants()


def test_pinned_partial_page_is_neither_claimed_nor_evicted() -> None:
    tree = chat_tree()
    assert tree.pin(TURN1) == 10
    assert (tree.locked_size, tree.evictable_size) == (12, 0)
    slots, node = tree.match_prefix(TURN2)
    assert tree.claim_partial_page(node, TURN2[len(slots) :]) == []
    assert tree.evict(100) == []
    tree.unpin(TURN1)
    assert tree.claim_partial_page(node, TURN2[len(slots) :]) == [12, 13]
    tree.check_invariants()


def test_duplicate_partial_tail_returns_the_callers_whole_page() -> None:
    tree = chat_tree()
    # Slots 28..37 cover pages 7, 8 and the first half of 9; all three pages are duplicates.
    assert tree.insert(TURN1, list(range(28, 38))) == InsertResult(10, page(7) + page(8) + page(9))
    assert tree.total_size == 10


def test_partial_tail_inside_a_cached_full_page_is_a_duplicate() -> None:
    tree = RadixTree(page_size=PS)
    tree.insert(list(range(8)), page(1) + page(2))
    assert tree.insert(list(range(6)), page(5) + page(6)[:2]) == InsertResult(6, page(5) + page(6))
    assert tree.insert(list(range(6)), page(1) + page(2)[:2]) == InsertResult(6, [])
    tree.check_invariants()


def test_without_a_claim_the_partial_page_stays_until_evicted() -> None:
    tree = chat_tree()
    slots, node = tree.match_prefix(TURN2)
    tree.lock(node)
    # A scheduler that never claims recomputes 108, 109 into a fresh page, as SGLang does.
    req_slots = slots + page(4) + page(5)[:3]
    assert tree.insert(TURN2, req_slots) == InsertResult(8, [])
    tree.unlock(node)
    tree.check_invariants()
    assert (tree.total_size, tree.evictable_size) == (17, 20)
    assert tree.evict(1) == page(3)  # the older, redundant partial page goes first
    assert list(tree.sequences()) == [(None, TURN2, req_slots)]


def test_chunked_request_inserts_whole_pages_then_finishes() -> None:
    tree = RadixTree(page_size=PS)
    tokens, slots = list(range(10)), page(1) + page(2) + page(3)[:2]
    assert tree.insert(tokens[:8], slots[:8]) == InsertResult(0, [])
    prefix, node = tree.match_prefix(tokens[:8])
    tree.lock(node)
    assert (prefix, tree.locked_size, tree.evictable_size) == (slots[:8], 8, 0)
    assert tree.insert(tokens, prefix + slots[8:]) == InsertResult(8, [])
    tree.unlock(node)
    tree.check_invariants()
    assert (tree.total_size, tree.evictable_size) == (10, 12)


def test_slots_must_form_aligned_pages() -> None:
    tree = RadixTree(page_size=PS)
    with pytest.raises(ValueError, match="not one aligned page"):
        tree.insert([1, 2, 3], [5, 6, 7])
    with pytest.raises(ValueError, match="not one aligned page"):
        tree.insert([1, 2, 3, 4, 5], [4, 5, 7, 6, 8])
    assert tree.total_size == 0
    tree.insert([1, 2, 3, 4, 5, 6], page(1) + page(2)[:2])
    # Rejected after part of the walk: a bad new page, then a bad duplicate page.
    with pytest.raises(ValueError, match="not one aligned page"):
        tree.insert([1, 2, 3, 4, 9], page(1) + [9])
    with pytest.raises(ValueError, match="not one aligned page"):
        tree.insert([1, 2, 3, 4], [13, 14, 15, 16])
    tree.check_invariants()
    assert list(tree.sequences()) == [(None, [1, 2, 3, 4, 5, 6], page(1) + page(2)[:2])]


def test_claim_is_a_no_op_at_page_size_one() -> None:
    tree = RadixTree()
    tree.insert([1, 2], [1, 2])
    slots, node = tree.match_prefix([1, 2, 3])
    assert (slots, tree.claim_partial_page(node, [3])) == ([1, 2], [])


def test_continuation_follows_pages_and_partial_pages() -> None:
    tree = chat_tree()
    node = tree.match_prefix(TURN1[:4]).last_node
    assert tree.continuation(node, TURN1[4:6], 3) == TURN1[6:9]
    assert tree.continuation(node, TURN1[4:9], 5) == TURN1[9:]  # into the partial page
    assert tree.continuation(node, [999], 2) == []
    tree.check_invariants()
