"""How `select` turns the logprobs of each choice's own tokens into a decision.

The three methods of SGLang's `sglang.lang.choices`, same names and call signature. Each entry of
a token-logprob list is `[logprob, token_id, text]`; a null logprob (the first position of a
sequence with nothing before it) counts as 0. Ties go to the earliest choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

TokenLogprobs = list[list[Any]]


@dataclass(slots=True)
class ChoicesDecision:
    """The chosen text and everything the method scored on the way."""

    decision: str
    meta_info: dict[str, Any] = field(default_factory=dict)


class ChoicesSamplingMethod:
    """Base of the scoring methods; subclasses implement `__call__`."""

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return False

    def __call__(
        self,
        *,
        choices: Sequence[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[TokenLogprobs],
        output_token_logprobs: list[TokenLogprobs],
        unconditional_token_logprobs: list[TokenLogprobs] | None = None,
    ) -> ChoicesDecision:
        raise NotImplementedError


def logprob_values(entries: TokenLogprobs) -> list[float]:
    """The logprobs of `entries`, a null one read as 0."""
    return [0.0 if entry[0] is None else float(entry[0]) for entry in entries]


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def argmax(values: list[float]) -> int:
    return max(range(len(values)), key=lambda i: (values[i], -i))


class TokenLengthNormalized(ChoicesSamplingMethod):
    """Pick the choice whose tokens have the highest mean logprob."""

    def __call__(
        self,
        *,
        choices: Sequence[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[TokenLogprobs],
        output_token_logprobs: list[TokenLogprobs],
        unconditional_token_logprobs: list[TokenLogprobs] | None = None,
    ) -> ChoicesDecision:
        best = argmax(normalized_prompt_logprobs)
        return ChoicesDecision(
            decision=choices[best],
            meta_info={
                "normalized_prompt_logprobs": normalized_prompt_logprobs,
                "input_token_logprobs": input_token_logprobs,
                "output_token_logprobs": output_token_logprobs,
            },
        )


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Walk token positions left to right, keeping only the choices tied for the best logprob.

    A shorter choice is padded with its own mean logprob, so it can still win later positions.
    """

    def __call__(
        self,
        *,
        choices: Sequence[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[TokenLogprobs],
        output_token_logprobs: list[TokenLogprobs],
        unconditional_token_logprobs: list[TokenLogprobs] | None = None,
    ) -> ChoicesDecision:
        rows = [logprob_values(entries) for entries in input_token_logprobs]
        width = max(len(row) for row in rows)
        matrix = [row + [mean(row)] * (width - len(row)) for row in rows]
        remaining = list(range(len(choices)))
        for col in range(width):
            best = max(matrix[i][col] for i in remaining)
            remaining = [i for i in remaining if matrix[i][col] == best]
            if len(remaining) == 1:
                break
        return ChoicesDecision(
            decision=choices[remaining[0]],
            meta_info={
                "normalized_prompt_logprobs": normalized_prompt_logprobs,
                "greedy_logprob_matrix": matrix,
                "input_token_logprobs": input_token_logprobs,
                "output_token_logprobs": output_token_logprobs,
            },
        )


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """Pick the choice with the highest mean of (conditional - unconditional) token logprobs.

    The unconditional logprobs score the choice's tokens with no prompt, so a choice that is
    likely anywhere (a frequent word) gains nothing from being likely here.
    """

    @property
    def requires_unconditional_logprobs(self) -> bool:
        return True

    def __call__(
        self,
        *,
        choices: Sequence[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[TokenLogprobs],
        output_token_logprobs: list[TokenLogprobs],
        unconditional_token_logprobs: list[TokenLogprobs] | None = None,
    ) -> ChoicesDecision:
        if unconditional_token_logprobs is None:
            raise ValueError("unconditional_likelihood_normalized needs unconditional logprobs")
        scores = []
        for cond, uncond in zip(input_token_logprobs, unconditional_token_logprobs, strict=True):
            pairs = zip(logprob_values(cond), logprob_values(uncond), strict=True)
            scores.append(mean([c - u for c, u in pairs]))
        return ChoicesDecision(
            decision=choices[argmax(scores)],
            meta_info={
                "normalized_prompt_logprobs": normalized_prompt_logprobs,
                "normalized_unconditional_prompt_logprobs": scores,
                "input_token_logprobs": input_token_logprobs,
                "output_token_logprobs": output_token_logprobs,
                "unconditional_token_logprobs": unconditional_token_logprobs,
            },
        )


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
