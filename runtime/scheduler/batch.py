"""ScheduledBatch: what one scheduler step runs, handed from the scheduler to the output
processor (its own module so that neither of the two imports the other for it)."""

from __future__ import annotations

from dataclasses import dataclass

from .req import Req


@dataclass(slots=True)
class ScheduledBatch:
    reqs: list[Req]
    num_new: list[int]  # tokens computed per request this step
    is_prefill: list[bool]  # computing prompt tokens (not a one-token decode)

    def describe(self) -> dict[str, int]:
        """{rid: num_tokens}, the step as tests and logs see it."""
        return {r.rid: n for r, n in zip(self.reqs, self.num_new)}
