"""EngineCore: the parts one engine step needs, built in one place (the engine and the tests
build them here: `load_runner`, then `build_core`), and the step itself:

    schedule -> prepare -> forward -> process outputs -> finish the step

The scheduler decides (scheduler/scheduler.py), the planner lays the step out for the model
(scheduler/planner.py), the runner computes logits (executor/model_runner.py), the output
processor turns them into tokens and finish reasons (scheduler/output_processor.py), and the
scheduler hands the KV of finished requests back to the cache.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .config import EngineConfig
from .dtype_policy import DtypeChoice, MachineMeasurements
from .executor.model_runner import ModelRunner
from .faults import Faults
from .measured import KeptMeasurements
from .models.gguf_int4 import gguf_vocab_type, has_gguf_int4_blocks
from .models.layers import cost_row_limits
from .models.loader import LoadedModel, cache_root, load_model
from .models.weights import few_rows
from .sampling.sampler import Sampler
from .scheduler.batch import ScheduledBatch
from .scheduler.output_processor import OutputProcessor
from .scheduler.planner import prepare_step
from .scheduler.scheduler import Scheduler
from .scheduler.speculative import DraftBudget
from .scheduler.speculative_sources import speculative_sources
from .scheduler.step_cost import StepCost
from .tokenizer import Tokenizer
from .weight_plan import WeightPlan, plan_weights

if TYPE_CHECKING:
    from .executor.tensor_parallel import TensorParallel


@dataclass  # not slots: tests hold the engine's loop by patching step on the instance
class EngineCore:
    runner: ModelRunner
    outputs: OutputProcessor
    scheduler: Scheduler
    batch: ScheduledBatch | None = None  # the step in progress, then the last one decided

    def step(self) -> ScheduledBatch:
        """One step; its batch holds the requests that advanced and those it rejected."""
        self.batch = None  # if deciding fails, there is no step: the engine fails what runs
        compiles, start = graphs_compiled(), time.perf_counter()
        self.batch = batch = self.scheduler.schedule()
        if batch.reqs:
            fb, plans = prepare_step(self.runner, batch)
            self.outputs.process(batch, plans, self.runner.forward(fb))
        self.scheduler.finish_step(batch)
        if self.outputs.budget is not None:  # drafting decides from the steps it measured
            seconds = time.perf_counter() - start
            self.outputs.budget.observe(batch, seconds, graphs_compiled() == compiles)
        return batch


def graphs_compiled() -> int:
    """Graphs Dynamo compiled (or loaded from Inductor's cache) in this process so far; 0
    where it was never imported. A step that compiled one took seconds for it (11 s for the
    first batch of 8 requests on a 2-core EPYC), which is no measure of what steps cost."""
    utils = sys.modules.get("torch._dynamo.utils")
    return 0 if utils is None else int(utils.counters["stats"]["unique_graphs"])


def build_core(
    cfg: EngineConfig, runner: ModelRunner, tokenizer: Tokenizer, vocab_size: int
) -> EngineCore:
    """The sampler, output processor and scheduler over a built runner."""
    sampler = Sampler(vocab_size, tokenizer.eos_token_ids, cfg.random_seed)
    budget = None
    if cfg.speculative_algorithm == "NGRAM":
        # a step's cost jumps where a linear changes kernel or its kernel starts another
        # block of rows, and past the tokens the compiled step takes (more run eager):
        # priced per span (speculative.py)
        limits = cost_row_limits(runner.model)
        if (compiled := runner.model.compiled) is not None:
            limits.append(compiled.max_rows)
        cost = StepCost(limits)
        budget = DraftBudget(cfg.speculative_num_draft_tokens - 1, cost)
    outputs = OutputProcessor(
        tokenizer, sampler, runner.context_len, cfg.enable_jump_forward, budget
    )
    scheduler = Scheduler(cfg, runner, outputs.matcher_for)
    if budget is not None:
        budget.waiting = lambda: len(scheduler.waiting)
        outputs.drafts += speculative_sources(budget, scheduler.tree)
    return EngineCore(runner, outputs, scheduler)


def load_runner(
    cfg: EngineConfig,
    ckpt: str,
    dtype: DtypeChoice,
    faults: Faults | None = None,
    tp: TensorParallel | None = None,
) -> tuple[LoadedModel, ModelRunner, WeightPlan]:
    """Rank 0's model in `dtype`, its weights held as the plan decided for this machine (the
    plan goes to the other ranks too), and the runner over it with its KV memory."""
    loaded = load_model(ckpt, dtype.torch_dtype, cfg.device, tp=tp.group if tp else None)
    mc = loaded.config
    weight_bytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    kept = KeptMeasurements(cache_root(cfg.cache_dir) / "measured")
    machine = MachineMeasurements(mc.hidden_size, mc.intermediate_size, kept)
    auto = cfg.dtype == "auto"
    plan = plan_weights(cfg.quantization, dtype.name, cfg.device, machine, auto, weight_bytes)
    if auto and cfg.quantization is None and cfg.device == "cpu" and tp is None:
        plan = with_own_blocks(plan, loaded, dtype, kept)
    runner = ModelRunner(cfg, loaded, plan, faults, tp)
    runner.measurements = kept.summary()
    return loaded, runner, plan


def with_own_blocks(
    plan: WeightPlan,
    loaded: LoadedModel,
    dtype: DtypeChoice,
    kept: KeptMeasurements,
) -> WeightPlan:
    """The plan with a GGUF's own 4-bit blocks, and its Q8_0 vocabulary projection as per-row
    int8, for the steps of few rows where they measured faster here (what a llama.cpp user
    chose by picking the file); as it was for other checkpoints. kept: where the verdicts
    are kept across starts (measured.py)."""
    mc, torch_dtype = loaded.config, dtype.torch_dtype
    # the key: what each verdict was measured for (the plan's forms, the shape, the dtype)
    key = (plan.linear_form, plan.vocab_form, mc.hidden_size, str(torch_dtype))
    if has_gguf_int4_blocks(loaded.ckpt_dir):
        q_size, kv_size = mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim
        shapes = few_rows.layer_shapes(mc.hidden_size, mc.intermediate_size, q_size, kv_size)
        rows = kept.value(  # under the margin it was chosen by: another's verdict is not read
            "own_int4_rows",
            (*key, shapes, few_rows.INT4_WIN_MARGIN),
            lambda: few_rows.own_int4_rows(plan, shapes, torch_dtype),
        )
        plan = plan.with_own_blocks("int4", rows, "the GGUF")
    if gguf_vocab_type(loaded.ckpt_dir) == "Q8_0":
        rows = kept.value(
            "own_int8_vocab_rows",
            (*key, mc.vocab_size),
            lambda: few_rows.own_int8_vocab_rows(plan, mc.hidden_size, mc.vocab_size, torch_dtype),
        )
        plan = plan.with_own_blocks("int8", rows, "the GGUF", vocab=True)
    return plan
