"""The draft sources of speculative decoding without a draft model (SGLang's NGRAM
algorithm), after the constraint's forced text: `RadixDraft` proposes what the radix cache
holds after the request's exact sequence so far (an earlier answer to the same prompt);
`NGramDraft` proposes what followed the latest earlier occurrence of the request's last n
tokens (n from `MAX_NGRAM` down to `MIN_NGRAM`) in its own prompt and output: a rewrite,
code edited in place, a quoted document. Each asks the draft budget (speculative.py) how
many tokens the request may draft, and looks nothing up where that is none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .ngram import MAX_NGRAM, MIN_NGRAM, NGramIndex
from .req import Req
from .speculative import DraftBudget

if TYPE_CHECKING:
    from ...radix import RadixTree
    from .draft import DraftSource


class NGramDraft:
    """Prompt lookup over the request's verified tokens (prompt and output), as long as the
    budget allows; a constrained request's draft ends before the first token its grammar
    refuses."""

    speculative = True  # its drafts are the budget's to keep or drop (DraftBudget.settle)

    def __init__(self, budget: DraftBudget, min_n: int = MIN_NGRAM, max_n: int = MAX_NGRAM):
        self.budget, self.min_n, self.max_n = budget, min_n, max_n

    def propose(self, req: Req) -> list[int]:
        limit = self.budget.length(req)
        if limit <= 0:
            return []
        index = req.ngrams
        if index is None:
            index = req.ngrams = NGramIndex(self.max_n)
        prompt = req.input_ids  # the index holds prompt + output so far; feed what is new
        if len(index.tokens) < len(prompt):
            index.extend(prompt[len(index.tokens) :])
        index.extend(req.output_ids[len(index.tokens) - len(prompt) :])
        draft = index.lookup(limit, self.min_n)
        if draft and req.grammar is not None:
            draft = allowed_prefix(req.grammar, draft)
        return draft


class RadixDraft:
    """What earlier requests wrote after this request's exact sequence so far: the radix
    cache holds every finished request's prompt and output, so a request that repeats one
    (a retried call, an agent step that recurs, the same question again) drafts the rest of
    the earlier answer along the most recently used path."""

    speculative = True

    def __init__(self, budget: DraftBudget, tree: RadixTree):
        self.budget, self.tree = budget, tree

    def propose(self, req: Req) -> list[int]:
        node = req.last_node
        if node is None or not node.is_attached or not node.children:
            return []  # (no children: the tree holds nothing past the request's prefix)
        limit = self.budget.length(req)
        if limit <= 0:
            return []
        start, prompt = req.num_tree_slots, len(req.input_ids)
        if start < prompt:
            after = req.input_ids[start:] + req.output_ids
        else:
            after = req.output_ids[start - prompt :]
        draft = self.tree.continuation(node, after, limit)
        if draft and req.grammar is not None:
            draft = allowed_prefix(req.grammar, draft)
        return draft


def speculative_sources(budget: DraftBudget, tree: RadixTree | None) -> list[DraftSource]:
    """The NGRAM sources, in order: the radix tree's exact history first, then prompt lookup."""
    return [*([RadixDraft(budget, tree)] if tree is not None else []), NGramDraft(budget)]


def allowed_prefix(matcher, draft: list[int]) -> list[int]:
    """The draft up to the first token the constraint refuses (the matcher is left where it
    was)."""
    taken = 0
    try:
        for token in draft:
            if matcher.is_finished() or not matcher.allows(token):
                break
            matcher.accept_token(token)
            taken += 1
    finally:
        if taken:
            matcher.rollback(taken)
    return draft[:taken]
