"""The weight plan: the form every linear's weight is held and multiplied in, and the
vocabulary projection's (one class each in models/weights/), decided once per engine from the
dtype, the quantization asked for and what the machine measured, then applied whole by every
tensor-parallel rank. Beside models/weights/ it is the one place that names the forms; it
imports nothing heavy, so config.py takes the quantization names from it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger("stemma.dtype")

# --quantization: int8 / int4 weight-only and w8a8_int8 (int8 weights and activations);
# "none" holds a quantized checkpoint dequantized, in the dtype (never its own blocks).
QUANTIZATION_METHODS = ("int8", "int4", "w8a8_int8")
QUANTIZATION_NONE = "none"
# The forms a checkpoint may carry its own blocks in (a GGUF's Q4_0 / Q4_1: int4), and its
# vocabulary projection's own weights in (a GGUF's Q8_0, per-row int8).
OWN_FORMS = ("int4",)
OWN_VOCAB_FORMS = ("int8",)
# Every form's name (models/weights.FORMS has one class for each): "plain" is F.linear,
# "packed" oneDNN's blocked bfloat16 layout, "small_steps" a bfloat16 copy for steps of few
# rows, "fp16" float16 weights in fbgemm's float32 matmul.
LINEAR_FORMS = ("plain", "packed", "small_steps", "fp16", *QUANTIZATION_METHODS)
VOCAB_FORMS = ("plain", "packed", "small_steps", "fp16", "int8")
# On CPU a vocabulary projection of at least this many rows multiplies faster by a transposed
# copy of its weight ([hidden, vocab], streamed row-major).
TRANSPOSED_VOCAB_ROWS = 8


@dataclass(frozen=True, slots=True)
class WeightPlan:
    linear_form: str = "plain"  # a name of LINEAR_FORMS
    vocab_form: str = "plain"  # a name of VOCAB_FORMS
    small_step_rows: int = 0  # small_steps: steps of at most this many rows use the copy
    # a plain vocabulary projection: from this many rows on, its transposed copy (0: never)
    transposed_vocab_rows: int = 0
    # why the weights compute otherwise than the dtype says (a measured choice); "" if not
    reason: str = ""
    # The checkpoint's own blocks (a name of OWN_FORMS) multiply steps of at most own_rows
    # rows, the linear form the rest ("": none); dtype "auto" with a GGUF's 4-bit linears.
    own_form: str = ""
    own_rows: int = 0
    # The same for the vocabulary projection (a name of OWN_VOCAB_FORMS), beside vocab_form.
    own_vocab_form: str = ""
    own_vocab_rows: int = 0

    def __post_init__(self) -> None:
        if self.linear_form not in LINEAR_FORMS or self.vocab_form not in VOCAB_FORMS:
            raise ValueError(
                f"weight plan: linear form {self.linear_form!r} (one of {LINEAR_FORMS}) and "
                f"vocabulary form {self.vocab_form!r} (one of {VOCAB_FORMS})"
            )
        uses_copy = "small_steps" in (self.linear_form, self.vocab_form)
        if (
            self.small_step_rows < 0
            or self.transposed_vocab_rows < 0
            or uses_copy != (self.small_step_rows > 0)
        ):
            raise ValueError(
                f"weight plan: small_step_rows={self.small_step_rows} (> 0 exactly with form "
                f"small_steps), transposed_vocab_rows={self.transposed_vocab_rows} (>= 0)"
            )

        for name, form, rows, forms in (
            ("own", self.own_form, self.own_rows, OWN_FORMS),
            ("own vocabulary", self.own_vocab_form, self.own_vocab_rows, OWN_VOCAB_FORMS),
        ):
            if (form and form not in forms) or rows < 0 or bool(form) != (rows > 0):
                raise ValueError(
                    f"weight plan: {name} form {form!r} (one of {forms} or '') with "
                    f"{name.replace(' ', '_')}_rows={rows} (> 0 exactly with an {name} form)"
                )

    def with_own_blocks(
        self, form: str, rows: int, checkpoint: str, vocab: bool = False
    ) -> WeightPlan:
        """This plan with the checkpoint's own blocks in `form` for steps of at most `rows`
        rows (measured: the most rows at which they beat this plan's linear form, or with
        `vocab` its vocabulary form for the vocabulary projection; 0 keeps the plan, noting
        why). checkpoint: what carries them, for the reason."""
        own = f"{checkpoint}'s own {form} {'weights' if vocab else 'blocks'}"
        which = "the vocabulary: " if vocab else ""
        if rows == 0:
            other = self.vocab_form if vocab else self.linear_form
            note = f"{which}{own} measured slower than {other}"
            return dataclasses.replace(self, reason=_joined(self.reason, note))
        note = f"{which}steps of <= {rows} rows multiply {own} (measured)"
        log.info("%s", note)
        fields = (
            {"own_vocab_form": form, "own_vocab_rows": rows}
            if vocab
            else {"own_form": form, "own_rows": rows}
        )
        return dataclasses.replace(self, **fields, reason=_joined(self.reason, note))

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode()

    @staticmethod
    def from_json(data: bytes) -> WeightPlan:
        return WeightPlan(**json.loads(data))


class Measurements(Protocol):
    """What plan_weights asks of the machine. dtype_policy.MachineMeasurements measures each
    when first asked (the speed verdicts cost about a second); tests pass a `Measured`."""

    @property
    def can_pack(self) -> bool: ...  # oneDNN has bfloat16 kernels for packed weights

    @property
    def fp16_kernel(self) -> bool: ...  # torch has fbgemm's float16-weight matmul

    @property
    def fp16_weights_win(self) -> bool: ...  # ... and it beat float32 at 1, 8 and 64 rows

    @property
    def small_step_rows(self) -> int: ...  # the most rows where bfloat16 beat float32; 0

    @property
    def available_bytes(self) -> int | None: ...  # free memory, None if unknown


@dataclass(frozen=True, slots=True)
class Measured:
    """Measurements given outright."""

    can_pack: bool = False
    fp16_kernel: bool = False
    fp16_weights_win: bool = False
    small_step_rows: int = 0
    available_bytes: int | None = None


def plan_weights(
    quantization: str | None,
    dtype: str,
    device: str,
    machine: Measurements,
    auto: bool = False,
    weight_bytes: int = 0,
) -> WeightPlan:
    """The plan for a model of `dtype` (a resolved name, e.g. "float32") on `device`: the
    quantization asked for (None or "none": none); packed weights where oneDNN runs
    bfloat16; with `auto` (dtype "auto" was asked for) a float32 model on a CPU without
    native bfloat16 holds its weights as float16 for fbgemm if that measured faster, else
    gets bfloat16 copies for steps of the measured few rows, if they cost at most a quarter
    of free memory (weight_bytes: the model's); else plain weights. A checkpoint's own blocks
    join later (WeightPlan.with_own_blocks)."""
    transposed = TRANSPOSED_VOCAB_ROWS if device == "cpu" and dtype != "float64" else 0
    if quantization not in (None, QUANTIZATION_NONE):
        return WeightPlan(quantization, _quantized_vocab(quantization, machine), 0, transposed)
    if device == "cpu" and dtype == "bfloat16" and machine.can_pack:
        return WeightPlan("packed", "packed")
    plain = WeightPlan(transposed_vocab_rows=transposed)
    if not auto or device != "cpu" or dtype != "float32":
        return plain
    if machine.fp16_weights_win:
        reason = "linears on float16 weights in fbgemm's matmul (measured)"
        log.info("dtype float32; %s", reason)
        return WeightPlan("fp16", "fp16", 0, transposed, reason)
    available = machine.available_bytes
    if available is None or weight_bytes // 2 > available // 4:
        return plain
    rows = machine.small_step_rows
    if not rows:
        return plain
    reason = f"steps of <= {rows} rows use a bfloat16 weight copy (measured)"
    log.info("dtype float32; %s", reason)
    return WeightPlan("small_steps", "small_steps", rows, transposed, reason)


def _joined(reason: str, note: str) -> str:
    return f"{reason}; {note}" if reason else note


def _quantized_vocab(method: str, machine: Measurements) -> str:
    """The vocabulary projection's form under `method`: int8 weight-only under int4, as
    llama.cpp's 4-bit files keep it at 8 bits (its error reaches every logit). Under
    w8a8_int8, float16 weight-only where fbgemm has it (else int8): int8 activations there
    moved top-1 tokens of SmolLM2 (agreement 0.84 with float32)."""
    if method == "w8a8_int8" and machine.fp16_kernel:
        return "fp16"
    return "int8"
