"""Token-run and page helpers for the radix tree (no tree state here).

A page of size `page_size` is an aligned run of slots: page p owns p*ps .. p*ps+ps-1, and
token position j of a sequence sits at page offset j % ps.
"""

from __future__ import annotations

_CHUNK = 64  # tokens compared per slice before falling back to a token-by-token scan


def common_prefix_len(edge: list[int], tokens: list[int], start: int) -> int:
    """Length of the common prefix of `edge` and `tokens[start:]`, compared in C-speed slices."""
    n = min(len(edge), len(tokens) - start)
    if edge[:n] == tokens[start : start + n]:
        return n
    i = 0
    while i + _CHUNK <= n and edge[i : i + _CHUNK] == tokens[start + i : start + i + _CHUNK]:
        i += _CHUNK
    while edge[i] == tokens[start + i]:  # a mismatch exists before n, so this stops
        i += 1
    return i


def whole_pages(slots: list[int], page_size: int) -> list[int]:
    """`slots` (a page-aligned run) padded to its last page's end."""
    if page_size == 1 or not slots or len(slots) % page_size == 0:
        return slots
    last = slots[-1]
    return slots + list(range(last + 1, last - last % page_size + page_size))


def num_page_slots(num_tokens: int, page_size: int) -> int:
    """Slots held by a run of num_tokens tokens that starts on a page boundary."""
    return -(-num_tokens // page_size) * page_size


def check_page_structure(slots: list[int], page_size: int) -> None:
    """Raise ValueError unless slots[j] lies at offset j % page_size of an aligned page."""
    if page_size == 1:
        return
    for j in range(0, len(slots), page_size):
        run = slots[j : j + page_size]
        base = run[0]
        if base % page_size or run != list(range(base, base + len(run))):
            raise ValueError(
                f"slots[{j}:{j + len(run)}] = {run} is not one aligned page of size {page_size}; "
                "with page_size > 1 token j must sit at offset j % page_size of its page"
            )


def dup_slots(given: list[int], cached: list[int], page_size: int) -> list[int]:
    """Given slots that differ from the cached ones for the same tokens (whole pages if paged)."""
    if given == cached:
        return []
    if page_size == 1:
        return [g for g, c in zip(given, cached, strict=True) if g != c]
    dups: list[int] = []
    for j in range(0, len(given), page_size):
        run = given[j : j + page_size]
        if run != cached[j : j + page_size]:
            check_page_structure(run, page_size)
            dups.extend(range(run[0], run[0] + page_size))
    return dups
