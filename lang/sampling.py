"""Sampling options of one gen, and how program-level defaults fill the ones a gen leaves unset.

`SamplingParams` holds every knob a `gen(...)` or `run(...)` may set; None means "not set here",
so the runtime's own default applies. Field names are the /generate wire names. Four fields
(`return_logprob` ... `return_text_in_logprobs`) are request-level rather than `sampling_params`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .sampling_table import check_param, check_together

REQUEST_LEVEL_FIELDS = (
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
)


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """What one gen asks of the sampler; unset (None) fields fall back to program defaults."""

    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    n: int | None = None
    seed: int | None = None
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None

    def __post_init__(self) -> None:
        # The runtime's own table (lang/sampling_table.py): a value /generate would refuse
        # fails here, at the gen or run that set it, with the runtime's message.
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                check_param(f.name, value)
        check_together({f.name: getattr(self, f.name) for f in fields(self)})

    def merged(self, defaults: SamplingParams) -> SamplingParams:
        """These params with every unset field taken from `defaults` (the gen's own value wins)."""
        values = {}
        for f in fields(self):
            own = getattr(self, f.name)
            values[f.name] = own if own is not None else getattr(defaults, f.name)
        return SamplingParams(**values)

    def with_extra_stop(self, stop: str) -> SamplingParams:
        """These params with `stop` added to the stop strings (kept once)."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["stop"] = stops if stop in stops else [*stops, stop]
        return SamplingParams(**values)

    def sampling_dict(self) -> dict[str, Any]:
        """The wire `sampling_params`: set fields only, request-level fields left out."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) is not None and f.name not in REQUEST_LEVEL_FIELDS
        }

    def request_fields(self) -> dict[str, Any]:
        """The set request-level fields (logprob options) of the /generate request."""
        return {
            name: getattr(self, name)
            for name in REQUEST_LEVEL_FIELDS
            if getattr(self, name) is not None
        }


SAMPLING_FIELD_NAMES = frozenset(f.name for f in fields(SamplingParams))
