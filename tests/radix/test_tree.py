"""Scenarios at page_size 1 with exact slot ids, node shapes and eviction order."""

from __future__ import annotations

import pytest
from stemma.radix import InsertResult, MatchResult, RadixNode, RadixTree


def tree_with(*seqs: tuple[list[int], list[int]]) -> RadixTree:
    tree = RadixTree()
    for tokens, slots in seqs:
        tree.insert(tokens, slots)
        tree.check_invariants()
    return tree


def path_len(node: RadixNode | None) -> int:
    num_tokens = 0
    while node is not None:
        num_tokens, node = num_tokens + len(node.key), node.parent
    return num_tokens


def test_match_on_empty_tree_returns_root() -> None:
    tree = RadixTree()
    slots, node = tree.match_prefix([1, 2, 3])
    assert (slots, node.is_root) == ([], True)
    assert (tree.total_size, tree.evictable_size, tree.locked_size) == (0, 0, 0)


def test_insert_then_full_match() -> None:
    tree = RadixTree()
    assert tree.insert([1, 2, 3, 4], [10, 11, 12, 13]) == InsertResult(0, [])
    result = tree.match_prefix([1, 2, 3, 4, 5])
    assert isinstance(result, MatchResult)
    assert result.slots == [10, 11, 12, 13]
    assert result.last_node.key == [1, 2, 3, 4]
    assert (tree.total_size, tree.evictable_size) == (4, 4)


def test_partial_match_splits_the_edge() -> None:
    tree = tree_with(([1, 2, 3, 4], [10, 11, 12, 13]))
    slots, node = tree.match_prefix([1, 2, 9])
    tree.check_invariants()
    assert slots == [10, 11]
    assert (node.key, node.value) == ([1, 2], [10, 11])
    assert list(node.children) == [3]
    assert (node.children[3].key, node.children[3].value) == ([3, 4], [12, 13])
    assert node.parent is not None and node.parent.is_root
    assert tree.total_size == 4


def test_split_keeps_the_deeper_node_object() -> None:
    tree = RadixTree()
    tree.insert([1, 2, 3, 4], [10, 11, 12, 13])
    _, leaf = tree.match_prefix([1, 2, 3, 4])
    tree.match_prefix([1, 2])
    assert leaf.key == [3, 4] and leaf.parent is not None and leaf.parent.key == [1, 2]


def test_insert_reports_duplicate_slots() -> None:
    tree = tree_with(([1, 2, 3, 4], [10, 11, 12, 13]))
    # A request that did not reuse the cache computed [1, 2] again into slots 20, 21.
    assert tree.insert([1, 2, 5, 6], [20, 21, 22, 23]) == InsertResult(2, [20, 21])
    # A request that reused [1, 2] passes the tree's own slots back: they are not duplicates.
    assert tree.insert([1, 2, 5, 7], [10, 11, 30, 31]) == InsertResult(3, [30])
    tree.check_invariants()
    assert sorted(tree.sequences()) == [
        (None, [1, 2, 3, 4], [10, 11, 12, 13]),
        (None, [1, 2, 5, 6], [10, 11, 22, 23]),
        (None, [1, 2, 5, 7], [10, 11, 22, 31]),
    ]
    assert (tree.total_size, tree.evictable_size) == (7, 7)


def test_insert_of_a_cached_prefix_keeps_nothing() -> None:
    tree = tree_with(([1, 2, 3, 4], [10, 11, 12, 13]))
    assert tree.insert([1, 2], [40, 41]) == InsertResult(2, [40, 41])
    assert tree.insert([1, 2, 3], [10, 11, 12]) == InsertResult(3, [])
    assert tree.total_size == 4


def test_eviction_is_lru_leaf_first_then_the_parent() -> None:
    tree = tree_with(
        ([1, 2, 3], [1, 2, 3]),  # t1
        ([1, 2, 4], [1, 2, 4]),  # t2: [1, 2] splits into an inner node used at t2
        ([7], [7]),  # t3
    )
    # Leaves [3] (t1), [4] (t2), [7] (t3). Once [3] and [4] are gone, [1, 2] (t2) is a leaf
    # older than [7].
    assert tree.evict(1) == [3]
    assert tree.evict(1) == [4]
    assert tree.evict(1) == [1, 2]
    assert tree.evict(1) == [7]
    assert tree.evict(1) == []
    tree.check_invariants()


def test_match_refreshes_lru_order() -> None:
    tree = tree_with(([1, 2, 3], [1, 2, 3]), ([1, 2, 4], [1, 2, 4]), ([7], [7]))
    tree.match_prefix([1, 2, 3])
    assert tree.evict(100) == [4, 7, 3, 1, 2]
    assert (tree.total_size, tree.evictable_size) == (0, 0)


def test_evict_frees_whole_nodes_at_least_the_request() -> None:
    tree = tree_with(([1, 2, 3], [5, 6, 7]), ([9], [8]))
    assert tree.evict(2) == [5, 6, 7]
    assert tree.evictable_size == 1


def test_locked_path_is_never_evicted() -> None:
    tree = tree_with(([1, 2, 3], [1, 2, 3]), ([1, 2, 4], [1, 2, 4]), ([7], [7]))
    slots, node = tree.match_prefix([1, 2, 4, 5])
    assert slots == [1, 2, 4]
    tree.lock(node)
    assert (tree.locked_size, tree.evictable_size) == (3, 2)
    assert node.lock_ref == 1 and node.parent is not None and node.parent.lock_ref == 1
    assert tree.evict(100) == [3, 7]
    tree.check_invariants()
    assert tree.match_prefix([1, 2, 4]).slots == [1, 2, 4]
    tree.unlock(node)
    assert (tree.locked_size, tree.evictable_size) == (0, 3)
    assert tree.evict(100) == [4, 1, 2]


def test_lock_counts_add_up_along_the_path() -> None:
    tree = tree_with(([1, 2, 3], [1, 2, 3]), ([1, 2, 4], [1, 2, 4]))
    _, leaf3 = tree.match_prefix([1, 2, 3])
    _, leaf4 = tree.match_prefix([1, 2, 4])
    _, inner = tree.match_prefix([1, 2])
    for node in (leaf3, leaf4, inner, leaf4):
        tree.lock(node)
        tree.check_invariants()
    assert (leaf3.lock_ref, leaf4.lock_ref, inner.lock_ref) == (1, 2, 4)
    tree.unlock(leaf4)
    assert (leaf4.lock_ref, inner.lock_ref) == (1, 3)
    assert tree.locked_size == 4


def test_split_of_a_locked_edge_carries_the_lock() -> None:
    tree = tree_with(([1, 2, 3, 4], [1, 2, 3, 4]))
    _, leaf = tree.match_prefix([1, 2, 3, 4])
    tree.lock(leaf)
    _, upper = tree.match_prefix([1, 2])
    tree.check_invariants()
    assert (upper.lock_ref, leaf.lock_ref, tree.locked_size) == (1, 1, 4)
    tree.unlock(leaf)
    assert (upper.lock_ref, tree.locked_size, tree.evictable_size) == (0, 0, 4)


def test_unlock_without_lock_raises() -> None:
    tree = tree_with(([1], [1]))
    _, node = tree.match_prefix([1])
    with pytest.raises(ValueError, match="not locked"):
        tree.unlock(node)


def test_lock_of_an_evicted_node_raises() -> None:
    tree = tree_with(([1, 2], [1, 2]))
    _, node = tree.match_prefix([1, 2])
    assert tree.evict(2) == [1, 2]
    assert not node.is_attached
    with pytest.raises(ValueError, match="no longer in the tree"):
        tree.lock(node)


def test_root_lock_is_a_no_op() -> None:
    tree = RadixTree()
    _, root = tree.match_prefix([5])
    tree.lock(root)
    tree.unlock(root)
    assert root.lock_ref == 0
    tree.reset()


def test_pinned_prefix_survives_eviction() -> None:
    tree = tree_with(([1, 2, 3], [1, 2, 3]), ([4, 5], [4, 5]))
    assert tree.pin([1, 2, 3]) == 3
    assert (tree.locked_size, tree.evictable_size, tree.num_pins) == (3, 2, 1)
    assert tree.evict(100) == [4, 5]
    assert tree.match_prefix([1, 2, 3]).slots == [1, 2, 3]
    tree.unpin([1, 2, 3])
    assert (tree.locked_size, tree.num_pins) == (0, 0)
    assert tree.evict(100) == [1, 2, 3]
    tree.check_invariants()


def test_pin_takes_what_is_cached_and_nests() -> None:
    tree = tree_with(([1, 2, 3], [1, 2, 3]))
    assert tree.pin([1, 2, 9]) == 2
    assert tree.pin([1, 2, 9]) == 2
    assert tree.pin([8]) == 0
    tree.check_invariants()
    assert tree.evict(100) == [3]
    tree.unpin([1, 2, 9])
    assert tree.evict(100) == []
    tree.unpin([1, 2, 9])
    tree.unpin([8])
    assert tree.evict(100) == [1, 2]
    with pytest.raises(ValueError, match="no pin"):
        tree.unpin([1, 2, 9])


def test_namespaces_cache_separately() -> None:
    tree = RadixTree()
    tree.insert([1, 2, 3], [1, 2, 3])
    assert tree.insert([1, 2, 3], [4, 5, 6], namespace="lora-a") == InsertResult(0, [])
    assert tree.match_prefix([1, 2, 3]).slots == [1, 2, 3]
    assert tree.match_prefix([1, 2, 3], namespace="lora-a").slots == [4, 5, 6]
    assert tree.match_prefix([1, 2, 3], namespace="tenant-b").slots == []
    assert tree.pin([1, 2], namespace="lora-a") == 2
    assert tree.total_size == 6
    # One LRU across namespaces; the pin keeps lora-a's [1, 2].
    assert tree.evict(100) == [1, 2, 3, 6]
    assert sorted(tree.sequences(), key=repr) == [("lora-a", [1, 2], [4, 5])]
    tree.check_invariants()


def test_empty_namespace_roots_do_not_accumulate() -> None:
    """One namespace per request (cache salts): empty roots are dropped as they pile up, and
    namespaces that hold tokens keep theirs."""
    tree = RadixTree()
    tree.insert([1, 2], [1, 2], namespace="kept")
    for i in range(1000):
        tree.match_prefix([1, 2], namespace=f"salt-{i}")
    assert len(tree._roots) <= 2 * 1 + 64 + 1
    assert tree.match_prefix([1, 2], namespace="kept").slots == [1, 2]
    tree.insert([5, 6], [5, 6], namespace="salt-999")
    assert tree.pin([1, 2], namespace="kept") + tree.pin([5, 6], namespace="salt-999") == 4
    for i in range(1000, 2000):
        tree.insert([7], [7 + i], namespace=f"salt-{i}")
        assert tree.evict(1) == [7 + i]  # the pinned "kept" and "salt-999" stay
    assert len(tree._roots) <= 2 * 2 + 64 + 1
    assert tree.match_prefix([5, 6], namespace="salt-999").slots == [5, 6]
    tree.check_invariants()


def test_match_stats_count_hits_and_queries() -> None:
    tree = tree_with(([1, 2, 3], [1, 2, 3]))
    tree.match_prefix([1, 2, 3, 4])
    tree.match_prefix([1, 9])
    tree.match_prefix([1, 2, 3], count_stats=False)
    assert (tree.num_hit_tokens, tree.num_queried_tokens) == (4, 6)


def test_reset_returns_slots_and_drops_pins() -> None:
    tree = tree_with(([1, 2, 3], [1, 2, 3]), ([1, 4], [1, 4]))
    tree.pin([1, 4])
    tree.match_prefix([1, 2])
    _, node = tree.match_prefix([1, 4])
    assert sorted(tree.reset()) == [1, 2, 3, 4]
    tree.check_invariants()
    assert (tree.total_size, tree.evictable_size, tree.locked_size, tree.num_pins) == (0, 0, 0, 0)
    assert tree.match_prefix([1, 2, 3]).slots == []
    with pytest.raises(ValueError, match="no longer in the tree"):
        tree.lock(node)


def test_reset_refuses_while_a_request_holds_a_lock() -> None:
    tree = tree_with(([1, 2], [1, 2]))
    _, node = tree.match_prefix([1, 2])
    tree.lock(node)
    with pytest.raises(RuntimeError, match="1 locks held"):
        tree.reset()
    tree.unlock(node)
    assert tree.reset() == [1, 2]


def test_bad_input_raises_value_error() -> None:
    with pytest.raises(ValueError, match="page_size"):
        RadixTree(page_size=0)
    with pytest.raises(ValueError, match="3 tokens but 2 slots"):
        RadixTree().insert([1, 2, 3], [1, 2])


def test_long_edges_match_at_the_exact_mismatch() -> None:
    tokens = list(range(1000, 3000))
    tree = tree_with((tokens, list(range(1, 2001))))
    for cut in (0, 1, 63, 64, 65, 1000, 1999):
        query = tokens[:cut] + [-1] + tokens[cut + 1 :]
        slots, node = tree.match_prefix(query)
        assert slots == list(range(1, cut + 1))
        assert path_len(node) == cut
    tree.check_invariants()
    assert tree.total_size == 2000


def test_node_type_is_exported() -> None:
    tree = tree_with(([1], [1]))
    assert isinstance(tree.match_prefix([1]).last_node, RadixNode)


def test_continuation_reads_the_most_recent_path_without_changing_the_tree() -> None:
    tree = tree_with(([1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 14, 15]))
    tree.insert([1, 2, 3, 7, 8], [10, 11, 12, 16, 17])  # later: the more recent branch
    node = tree.match_prefix([1, 2]).last_node  # splits at 2, as a request's match would
    shape = [(ns, list(t), list(s)) for ns, t, s in tree.sequences()]
    sizes = (tree.total_size, tree.evictable_size, tree.locked_size)
    assert tree.continuation(node, [3], 4) == [7, 8]
    assert tree.continuation(node, [3, 4], 3) == [5, 6]
    assert tree.continuation(node, [3, 4, 5], 1) == [6]
    assert tree.continuation(node, [], 2) == [3, 7]
    assert tree.continuation(node, [3, 9], 3) == []  # another way than the tree's
    assert tree.continuation(node, [3, 4, 5, 6], 3) == []  # a leaf's end: nothing follows
    assert tree.continuation(node, [5], 3) == []
    assert [(ns, list(t), list(s)) for ns, t, s in tree.sequences()] == shape
    assert (tree.total_size, tree.evictable_size, tree.locked_size) == sizes
    tree.check_invariants()
