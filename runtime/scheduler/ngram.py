"""NGramIndex: where each n-gram of a token sequence last occurred, for prompt lookup drafts
(speculative.py). A leaf: it knows token ids only."""

from __future__ import annotations

MIN_NGRAM, MAX_NGRAM = 2, 4  # suffix lengths looked up, longest first


class NGramIndex:
    """For every n-gram (n <= max_n) of a token sequence, where its latest occurrence ends;
    the sequence's own last n tokens are entered only once a token follows them, so a lookup
    finds an earlier occurrence and the tokens after it."""

    __slots__ = ("tokens", "ends", "max_n")

    def __init__(self, max_n: int = MAX_NGRAM) -> None:
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], int] = {}
        self.max_n = max_n

    def extend(self, new: list[int]) -> None:
        tokens, ends = self.tokens, self.ends
        for token in new:
            i = len(tokens)
            for n in range(1, min(self.max_n, i) + 1):
                ends[tuple(tokens[i - n : i])] = i  # the n-gram before position i
            tokens.append(token)

    def lookup(self, max_tokens: int, min_n: int = MIN_NGRAM) -> list[int]:
        """Up to max_tokens tokens that followed the longest matching suffix, [] if none.

        An occurrence that runs into the sequence's end (text repeating with a period of
        `size - end` tokens: a list of the same item, a loop) goes on as the copy would, from
        the draft's own tokens, so a repetition drafts max_tokens rather than one period."""
        tokens, size = self.tokens, len(self.tokens)
        for n in range(min(self.max_n, size), min_n - 1, -1):
            end = self.ends.get(tuple(tokens[size - n :]))
            if end is not None:
                draft = tokens[end : end + max_tokens]
                while len(draft) < max_tokens:  # tokens[end:] == the period: repeat it
                    draft.append(draft[len(draft) - (size - end)])
                return draft
        return []
