"""SamplingParams: the `sampling_params` of one /generate request, validated and normalized.

Invariant: a constructed SamplingParams is valid (every field has its normalized type and is in
range), so nothing downstream re-checks it. Bad input raises TypeError / ValueError naming the
field, the value and what is allowed; the server turns them into HTTP 400s.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ...lang.sampling_table import SAMPLING_PARAMS, check_together, value_error

# SGLang's newer name for `seed`; from_dict folds it into `seed`.
_ALIASES = {"sampling_seed": "seed"}


@dataclass(slots=True)
class SamplingParams:
    """SGLang's native sampling parameters; build from JSON with `from_dict`."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0  # EOS and stop_token_ids are masked until this many are generated
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)  # sorted, unique
    stop_regex: list[str] = field(default_factory=list)
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0 = off
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    n: int = 1
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    regex: str | None = None
    json_schema: str | None = None  # a dict is serialized to JSON text
    ebnf: str | None = None
    structural_tag: str | None = None
    custom_params: dict[str, Any] | None = None  # accepted and carried; no meaning in stemma
    grammar_backend: str | None = None  # this request's; None: the engine's --grammar-backend
    property_order: str | None = None  # a json_schema's keys: "schema" (None) or "any" order
    stream_interval: int | None = None
    close_early: bool | None = None  # constrained/closing.py; None: on for json_schema

    @property
    def closes_early(self) -> bool:
        """Whether a constrained output ends valid within max_new_tokens (early closing)."""
        return self.close_early if self.close_early is not None else self.json_schema is not None

    def __post_init__(self) -> None:
        # Every field is a row of lang/sampling_table.py, the table lang's gen checks too.
        values = {}
        for name, row in SAMPLING_PARAMS.items():
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, row.check(value))
            values[name] = getattr(self, name)
        check_together(values)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> SamplingParams:
        """Parse a JSON `sampling_params` object; null values mean "not set"."""
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise TypeError(f"sampling_params must be an object, got {type(d).__name__} {d!r}")
        kwargs: dict[str, Any] = {}
        for key, value in d.items():
            name = _ALIASES.get(key, key)
            if name not in _FIELD_NAMES:
                known = ", ".join(sorted(_FIELD_NAMES | _ALIASES.keys()))
                raise ValueError(f"unknown sampling_params field {key!r}; known fields: {known}")
            if value is None:
                continue
            if name in kwargs and kwargs[name] != value:
                raise ValueError(
                    f"sampling_params.{key}={value!r} conflicts with {name}={kwargs[name]!r}"
                )
            kwargs[name] = value
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (logit_bias keys stay ints); from_dict(to_dict()) == self."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in out.items():
            if isinstance(value, (list, dict)):
                out[name] = value.copy()
        return out

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def check_vocab(self, vocab_size: int) -> None:
        """Raise ValueError if a token id in stop_token_ids or logit_bias is >= vocab_size."""
        for name, ids in (("stop_token_ids", self.stop_token_ids), ("logit_bias", self.logit_bias)):
            bad = [t for t in ids if t >= vocab_size]
            if bad:
                allowed = f"token ids in [0, {vocab_size - 1}]"
                raise value_error(f"sampling_params.{name}", bad, allowed)


_FIELD_NAMES = frozenset(f.name for f in fields(SamplingParams))
assert _FIELD_NAMES == SAMPLING_PARAMS.keys(), "SamplingParams and the table must list one set"
