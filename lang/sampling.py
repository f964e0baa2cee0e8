"""Sampling options of one gen, and how program-level defaults fill the ones a gen leaves unset.

`SamplingParams` holds every knob a `gen(...)` or `run(...)` may set; None means "not set here",
so the runtime's own default applies. Field names are the /generate wire names. Four fields
(`return_logprob` ... `return_text_in_logprobs`) are request-level rather than `sampling_params`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

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
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None

    def __post_init__(self) -> None:
        _check_int(self.max_new_tokens, "max_new_tokens (gen's max_tokens)", low=0)
        _check_int(self.min_new_tokens, "min_new_tokens (gen's min_tokens)", low=0)
        _check_int(self.n, "n", low=1)
        _check_int(self.top_logprobs_num, "top_logprobs_num", low=0)
        _check_int(self.logprob_start_len, "logprob_start_len", low=-1)
        _check_int(self.seed, "seed", low=None)
        _check_float(self.temperature, "temperature", 0.0, None)
        _check_float(self.top_p, "top_p", 0.0, 1.0, open_low=True)
        _check_float(self.min_p, "min_p", 0.0, 1.0)
        _check_float(self.frequency_penalty, "frequency_penalty", -2.0, 2.0)
        _check_float(self.presence_penalty, "presence_penalty", -2.0, 2.0)
        _check_float(self.repetition_penalty, "repetition_penalty", 0.0, None, open_low=True)
        if self.top_k is not None:
            _check_int(self.top_k, "top_k", low=-1)
            if self.top_k == 0:
                raise ValueError("top_k must be -1 (off) or >= 1, got 0")
        for name in ("ignore_eos", "return_logprob", "return_text_in_logprobs"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}")
        _check_stop(self.stop)
        _check_stop(self.stop_regex, "stop_regex")
        if self.stop_token_ids is not None and not (
            isinstance(self.stop_token_ids, list)
            and all(isinstance(t, int) and not isinstance(t, bool) for t in self.stop_token_ids)
        ):
            raise TypeError(f"stop_token_ids must be a list of ints, got {self.stop_token_ids!r}")
        for name in ("regex", "json_schema"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a str, got {type(value).__name__}")

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


def _check_int(value: Any, name: str, low: int | None) -> None:
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")


def _check_float(
    value: Any, name: str, low: float, high: float | None, open_low: bool = False
) -> None:
    if value is None:
        return
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {value!r}")
    too_low = value <= low if open_low else value < low
    if too_low or (high is not None and value > high):
        bounds = f"{'(' if open_low else '['}{low}, {high if high is not None else 'inf'}]"
        raise ValueError(f"{name} must be in {bounds}, got {value}")


def _check_stop(stop: Any, name: str = "stop") -> None:
    if stop is None or isinstance(stop, str):
        return
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise TypeError(f"{name} must be a str or a list of str, got {stop!r}")
