"""ModelRunner: the model plus the KV memory it writes, sized from the engine's budget.

Under tensor parallelism every rank builds one over its shard (its pool holds its KV heads);
rank 0's also sends each step to the other ranks before running it (tensor_parallel.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import torch

from ..config import EngineConfig
from ..dtype_policy import MachineMeasurements
from ..faults import Faults, InjectedFault
from ..models.decoder import DecoderForCausalLM
from ..models.gguf_int4 import gguf_int4_blocks, int4_from_gguf_blocks
from ..models.loader import LoadedModel, cache_root
from ..models.weights import FORMS, Int4Weight
from ..weight_plan import WeightPlan, plan_weights
from .attention import TorchAttnBackend, make_attention_backend
from .calibrate import calibration_ids, input_maxima
from .compiled import CompiledDecode, first_line
from .forward_batch import ForwardBatch
from .memory import KVPool, ReqToTokenPool, SlotAllocator

log = logging.getLogger("stemma.engine")


class StepRelay(Protocol):
    """Rank 0's link to the other tensor-parallel ranks (tensor_parallel.TensorParallel)."""

    def forward(self, fb: ForwardBatch, run: Callable[[], torch.Tensor]) -> torch.Tensor: ...


class ModelRunner:
    def __init__(
        self,
        cfg: EngineConfig,
        loaded: LoadedModel,
        plan: WeightPlan | None = None,
        faults: Faults | None = None,
        tp: StepRelay | None = None,
    ):
        """plan: how the weights are held (runtime/weight_plan.py), rank 0's on every rank;
        None: default_plan's. tp: rank 0's handle on the other ranks, None on them and
        without tensor parallelism."""
        self.cfg = cfg
        self.faults = faults or Faults()
        self.tp = tp
        self.model = loaded.model
        self.plan = plan or default_plan(cfg, self.model)
        self.weights_note = hold_weights(loaded, self.plan)  # when notable, for model info
        self.measurements: dict | None = None  # where the plan's verdicts are kept (measured.py)
        mc = self.model.cfg
        num_kv_heads = self.model.layout.num_kv_heads  # this rank's
        self.dtype = self.model.dtype
        self.device = torch.device(cfg.device)
        self.context_len = min(cfg.context_length or mc.max_position, mc.max_position)
        per_slot = KVPool.bytes_per_slot(mc.num_layers, num_kv_heads, mc.head_dim, self.dtype)
        num_slots = cfg.max_total_tokens or (cfg.kv_cache_mb << 20) // per_slot
        num_slots = max(num_slots, 2 * cfg.page_size)
        self.kv_pool = KVPool(
            num_slots, mc.num_layers, num_kv_heads, mc.head_dim, self.dtype, self.device
        )
        # Retracted requests keep no row, so running requests bound the rows needed.
        self.req_to_token_pool = ReqToTokenPool(
            cfg.max_running_requests, self.context_len + cfg.page_size, self.device
        )
        self.allocator = SlotAllocator(num_slots, cfg.page_size)
        self.attn = make_attention_backend(cfg.resolved_attention_backend)
        self.compile_note: str | None = None  # why the compiled step is off, when asked for
        if cfg.enable_torch_compile:
            cache = cache_root(cfg.cache_dir)
            try:
                self.model.compiled = compiled = CompiledDecode.build(
                    self.model,
                    self.kv_pool,
                    cfg.torch_compile_max_bs,
                    cache / "inductor",
                    aot=cfg.torch_compile_aot,
                    # one request's drafts (prompt lookup's, a constraint's forced text)
                    drafts=cfg.speculative_algorithm is not None or cfg.enable_jump_forward,
                )
                self.compile_note = compiled.note
                if isinstance(self.attn, TorchAttnBackend):  # drafts verified in its copy
                    self.attn.verify_in_copy = True
            except Exception as e:  # noqa: BLE001 - a form Inductor cannot lower runs eager
                self.compile_note = (
                    f"off: the {self.plan.linear_form!r} linears did not compile "
                    f"({type(e).__name__}: {first_line(e)})"
                )
                log.warning("enable_torch_compile: %s; running eager", self.compile_note)
        needs = [n for n, on in (("sliding_window", mc.sliding_window), ("attn_logit_softcapping",
                 mc.attn_softcap)) if on]  # fmt: skip
        if needs and cfg.resolved_attention_backend != "torch":
            raise ValueError(
                f"{mc.arch} uses {', '.join(needs)}, which only the torch attention backend "
                "implements; use attention_backend='torch'"
            )

    @property
    def num_slots(self) -> int:
        return self.kv_pool.num_slots

    def build_batch(
        self,
        req_pool_idx: list[int],
        prefix_lens: list[int],
        input_ids: list[list[int]],
        out_cache_loc: list[int],
        logit_rows: list[list[int]] | None = None,
    ) -> ForwardBatch:
        """Record each request's new slots in req_to_token, then pack the step."""
        start = 0
        for row, prefix, ids in zip(req_pool_idx, prefix_lens, input_ids):
            self.req_to_token_pool.write(row, prefix, out_cache_loc[start : start + len(ids)])
            start += len(ids)
        return ForwardBatch.build(
            self.req_to_token_pool.req_to_token,
            req_pool_idx,
            prefix_lens,
            input_ids,
            torch.tensor(out_cache_loc, dtype=torch.int32),
            logit_rows,
            self.device,
            [self.req_to_token_pool.epochs[row] for row in req_pool_idx],
        )

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """Logits [num_logit_rows, vocab] for one step (on rank 0; None on other ranks).
        Under tensor parallelism a lost rank raises tensor_parallel.WorkerLost."""
        if self.faults.take("forward_error"):
            raise InjectedFault("injected fault: the model forward failed")
        if self.tp is None:
            return self.model(fb, self.kv_pool, self.attn)
        return self.tp.forward(fb, lambda: self.model(fb, self.kv_pool, self.attn))


def default_plan(cfg: EngineConfig, model: DecoderForCausalLM) -> WeightPlan:
    """The plan without measuring speeds: the quantization asked for, packed weights where
    oneDNN runs bfloat16, else plain (the engine passes its measured plan instead)."""
    machine = MachineMeasurements(model.cfg.hidden_size, model.cfg.intermediate_size)
    dtype = str(model.dtype).removeprefix("torch.")
    return plan_weights(cfg.quantization, dtype, cfg.device, machine)


def hold_weights(loaded: LoadedModel, plan: WeightPlan) -> str | None:
    """Apply the plan, with what its linear form takes beside the float weights: a GGUF's own
    4-bit blocks, and each linear's calibrated input range. Returns a note on the weights for
    /get_model_info, None when there is nothing to note."""
    model, form = loaded.model, FORMS[plan.linear_form]
    given = {}
    if form is Int4Weight or plan.own_form == Int4Weight.name:
        given = int4_from_gguf_blocks(model, gguf_int4_blocks(loaded.ckpt_dir))
    maxima = None
    if form.calibrated:
        maxima = input_maxima(model, calibration_ids(loaded.tokenizer, model.cfg.vocab_size))
    model.apply_plan(plan, given, maxima)
    notes = []
    if given:
        note = (
            f"{len(given)} of {model.num_linears} linears packed from the GGUF's own 4-bit blocks"
        )
        if plan.own_form:
            note += f", for steps of <= {plan.own_rows} rows ({plan.linear_form} for the others)"
        notes.append(note)
    if plan.own_vocab_form:
        notes.append(
            f"the vocabulary projection as per-row {plan.own_vocab_form} from the GGUF's Q8_0, "
            f"for steps of <= {plan.own_vocab_rows} rows ({plan.vocab_form} for the others)"
        )
    if not notes:
        return None
    log.info("%s: %s", plan.linear_form, "; ".join(notes))
    return "; ".join(notes)
