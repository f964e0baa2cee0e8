"""ScheduledBatch: what the scheduler decided for one step, handed to the step planner and the
output processor (its own module so that none of them imports another for it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .req import Req


@dataclass(slots=True)
class ScheduledBatch:
    reqs: list[Req]  # run this step; empty when nothing can run now
    num_new: list[int]  # tokens computed per request this step
    is_prefill: list[bool]  # computing prompt tokens (not a one-token decode)
    rejected: list[Req] = field(default_factory=list)  # finished without running (aborts)

    def describe(self) -> dict[str, int]:
        """{rid: num_tokens}, the step as tests and logs see it."""
        return {r.rid: n for r, n in zip(self.reqs, self.num_new)}
