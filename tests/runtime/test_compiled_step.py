"""The compiled step (--enable-torch-compile): a decode step compiled whole by Inductor gives
what eager gives in float64 (to the float32 rounding of the norms), alone and in a batch (the
symbolic row count), across the dense K/V copy's regrowth (the symbolic capacity) and over
K/V it wrote into the pool (a prefix hit later reads them), for a Llama and a Gemma 2 (sliding
windows, soft caps, sandwich norms); a form that does not compile caps the rows it takes or
runs eager, and model info says why; with drafts (prompt lookup's, a regex's forced text),
which the graph verifies too, the output is still what eager decoding gives."""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
import zipfile

import pytest
import torch
from stemma.runtime.config import EngineConfig
from stemma.runtime.engine import Engine
from stemma.runtime.engine_core import graphs_compiled
from stemma.runtime.executor import compiled, decode_graph
from stemma.runtime.scheduler.step_cost import StepCost
from torch._dynamo.utils import counters

from .families import build_family

PROMPTS = [[5, 9, 23, 7, 11, 40], [3, 3, 8], [17, 2, 90, 61, 4, 4, 12, 30]]
# Past DecodeKV.HEADROOM (16) twice: the copy is gathered again at a larger capacity.
NEW_TOKENS = 40


def run(ckpt, compile_on: bool, tmp_path, graph_calls: list) -> tuple[list, list]:
    cfg = {
        "dtype": "float64",
        "kv_cache_mb": 16,
        "enable_torch_compile": compile_on,
        "cache_dir": str(tmp_path / "cache"),
    }
    params = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    with Engine(model_path=str(ckpt), **cfg) as e:
        assert (e.get_model_info()["torch_compile_s"] is not None) == compile_on
        if compile_on:  # count the steps each graph runs: rows, and which one
            graph = e.runner.model.compiled
            assert graph._single is not None  # the one-row package (compiled_aot.py)
            assert graph._batch is not None  # a few requests' decode steps' package
            step, single = graph._step, graph._single
            graph._step = lambda *a: graph_calls.append(a[1].shape[0]) or step(*a)
            graph._single = lambda flat: graph_calls.append("package") or single(flat)
            graph._batch = CountedPackage(graph._batch, graph_calls, "batch")
        alone = e.generate(input_ids=PROMPTS[0], sampling_params=params, return_logprob=True)
        batch = e.generate(
            input_ids=PROMPTS, sampling_params=[params] * len(PROMPTS), return_logprob=True
        )
        # A prompt holding the first answer: its prefix comes from the pool, as written.
        again = PROMPTS[0] + alone["output_ids"] + [8, 9]
        hit = e.generate(input_ids=again, sampling_params=params, return_logprob=True)
        assert hit["meta_info"]["cached_tokens"] >= len(again) - 3
    outs = [alone, *batch, hit]
    return [o["output_ids"] for o in outs], [
        [entry[0] for entry in o["meta_info"]["output_token_logprobs"]] for o in outs
    ]


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_compiled_step_equals_eager_in_float64(family, tiny_llama_dir, tmp_path_factory):
    if family == "llama":
        ckpt = tiny_llama_dir
    else:
        ckpt = build_family(tmp_path_factory.mktemp("tiny-gemma2"), "gemma2")
    tmp = tmp_path_factory.mktemp("compiled")
    depth = sys.getrecursionlimit()
    calls: list = []
    ids_eager, lp_eager = run(ckpt, False, tmp, calls)
    ids_compiled, lp_compiled = run(ckpt, True, tmp, calls)
    assert sys.getrecursionlimit() == depth  # Inductor's raise undone (the server relies on it)
    # Every decode step but each request's first (its prefill's) ran a package: the one-row
    # steps theirs, the batch's (three rows) that of a few requests' decode steps, none
    # Dynamo's graph (which took the step that prefilled beside decoding).
    assert calls.count("package") >= 2 * (NEW_TOKENS - 1)
    assert calls.count((3, "batch")) >= NEW_TOKENS - 1 and 3 not in calls and 1 not in calls
    assert ids_compiled == ids_eager
    # The norms normalize in float32 (as HF's do, even in a float64 model); Inductor's fused
    # reduction sums in another order, so values agree to float32 rounding, not bit for bit.
    for a, b in zip(lp_compiled, lp_eager):
        assert a == pytest.approx(b, abs=2e-5)


class CountedPackage:
    """A package (compiled_aot.py) that notes (tokens, label) for each step it runs."""

    def __init__(self, package, calls: list, label: str = "package") -> None:
        self.package, self.calls, self.max_tokens = package, calls, package.max_tokens
        self.label = label

    def __call__(self, flat):
        self.calls.append((flat[0].shape[0], self.label))
        return self.package(flat)


class FlatCost(StepCost):
    """Every step measured at 10 ms whatever its rows, so drafting always pays (the tiny
    model's real costs would have the budget decline drafts next to the graph's steps)."""

    def record(self, rows: int, drafted: bool, seconds: float) -> None:
        super().record(rows, drafted, 0.01)


def test_drafts_between_compiled_steps_change_nothing(tiny_llama_dir, tmp_path):
    """The graph verifies drafts too (several rows per request, one request's or two's),
    between its decode steps, without compiling inside a step: prompt lookup's drafts, which
    this random model rejects, and a regex's forced text, which it accepts. The graph must
    go on from the context the accepted tokens left, over positions a rejected draft wrote
    into the copy."""
    regex = "the keeper climbed [a-z]{6} the stairs [a-z]{6} and the keeper climbed [a-z]{9}"
    loop = [5, 9, 23, 7, 11, 40, 3, 8]
    params = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    outs, calls = {}, []
    for spec, compile_on in ((None, False), ("NGRAM", True)):
        cfg = {"dtype": "float64", "kv_cache_mb": 16, "enable_torch_compile": compile_on}
        cfg |= {"cache_dir": str(tmp_path / "cache"), "speculative_algorithm": spec}
        with Engine(model_path=str(tiny_llama_dir), **cfg) as e:
            if compile_on:  # (tokens, requests) of each step a graph takes
                info = e.get_model_info()
                assert info["torch_compile_drafts_package"]["max_tokens"] == 64
                # a few requests' decode steps: up to the cap, this model having no row limit
                batch_rows = info["torch_compile_batch_package"]["max_tokens"]
                assert batch_rows == compiled.BATCH_PACKAGE_ROWS < 64
                graph = e.runner.model.compiled._step
                e.runner.model.compiled._step = lambda *a, g=graph: (
                    calls.append((a[1].shape[0], a[8][0].shape[0])) or g(*a)
                )
                single = e.runner.model.compiled._single
                e.runner.model.compiled._single = lambda f, g=single: calls.append((1, 1)) or g(f)
                # one request's drafts, up to the graph's 64 tokens: their package
                compiled_step = e.runner.model.compiled
                compiled_step._drafts = CountedPackage(compiled_step._drafts, calls)
                compiled_step._batch = CountedPackage(compiled_step._batch, calls, "batch")
                # past the graph's tokens a step runs eager: the budget prices that apart
                assert 64 in e.core.outputs.budget.cost.limits
                e.core.outputs.budget.cost = FlatCost()
            graphs = counters["stats"]["unique_graphs"]
            outs[spec] = e.generate(
                input_ids=[loop * 4, [17, 2, 90]],
                sampling_params=[params, params | {"regex": regex}],
            )
            assert counters["stats"]["unique_graphs"] == graphs  # all compiled at start
    assert [o["output_ids"] for o in outs["NGRAM"]] == [o["output_ids"] for o in outs[None]]
    lookup, forced = (o["meta_info"] for o in outs["NGRAM"])
    assert lookup["spec_num_proposed_drafts"] > lookup["spec_num_correct_drafts"]  # rejected
    assert forced["spec_num_correct_drafts"] > 0  # accepted
    # the packages ran the steps without drafts, one request's and two requests'
    assert (1, 1) in calls and (2, "batch") in calls
    # ... and the steps that verify drafts: one request's by its package, two requests' by
    # Dynamo's graph
    assert any(t > 1 and r == "package" for t, r in calls)
    assert not any(t > 1 and r == 1 for t, r in calls)
    assert any(isinstance(r, int) and t > r > 1 for t, r in calls)


def test_flags_and_limits():
    cfg = EngineConfig(enable_torch_compile=True, torch_compile_max_bs=16)
    assert cfg.torch_compile_max_bs == 16
    with pytest.raises(ValueError, match="torch_compile_max_bs must be >= 1, got 0"):
        EngineConfig(enable_torch_compile=True, torch_compile_max_bs=0)
    with pytest.raises(ValueError, match="enable_torch_compile with tp_size > 1"):
        EngineConfig(enable_torch_compile=True, tp_size=2)


def test_a_step_that_does_not_compile_runs_eager_and_says_why(tiny_llama_dir, monkeypatch):
    """Inductor refuses some forms (oneDNN-packed bfloat16 wants frozen weights): where one
    row does not compile the engine runs eager, and model info names the form and the error."""

    def refuse(self, pool):
        raise RuntimeError("LoweringException: the weight must be a constant")

    monkeypatch.setattr(compiled.CompiledDecode, "warm_up", refuse)
    cfg = {"dtype": "float32", "kv_cache_mb": 8, "enable_torch_compile": True}  # plain forms
    with Engine(model_path=str(tiny_llama_dir), **cfg) as e:
        info = e.get_model_info()
        out = e.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 3})
    assert info["torch_compile_s"] is None
    note = info["torch_compile_note"]
    assert re.match(r"off: the '\w+' linears did not compile \(RuntimeError: Lowering", note)
    assert len(out["output_ids"]) == 3


def int4_blocks_up_to_two_rows(tiny_llama_dir, rows: int = 2):
    """The tiny llama with int4 blocks for steps of at most `rows` rows, float32 past them,
    and a K/V pool for it."""
    from stemma.runtime.executor.memory import KVPool
    from stemma.runtime.models.layers import Linear
    from stemma.runtime.models.loader import load_decoder
    from stemma.runtime.models.weights import Int4Weight
    from stemma.runtime.weight_plan import WeightPlan

    net, _ = load_decoder(tiny_llama_dir, torch.float32, "cpu")
    plan = WeightPlan(own_form="int4", own_rows=rows)
    linears = [m for m in net.layers.modules() if isinstance(m, Linear)]
    net.apply_plan(plan, {m: Int4Weight.from_weight(m.weight, plan) for m in linears})
    cfg = net.cfg
    return net, KVPool(16, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, torch.float32)


def test_warm_up_reaches_past_each_row_limit_and_caps_the_rows_there(tiny_llama_dir):
    """A linear that changes kernel past N rows (the GGUF's own blocks, weights/few_rows.py)
    is warmed up at N + 1 rows too, so the other side's compile fails, if it does, at start
    and never inside a step; the graph then takes steps of at most N rows and says so."""
    net, pool = int4_blocks_up_to_two_rows(tiny_llama_dir)
    assert compiled.CompiledDecode(net, 64).warm_up_rows() == [1, 2, 3]
    assert compiled.CompiledDecode(net, 2).warm_up_rows() == [1, 2]

    seen: list[int] = []

    def step(model, ids, *rest):  # records the rows instead of compiling; 3 fails
        seen.append(ids.shape[0])
        if ids.shape[0] > 2:
            raise RuntimeError("LoweringException: the weight must be a constant")

    graph = compiled.CompiledDecode(net, 64)
    graph._step = step
    graph.warm_up(pool)
    assert seen == [1, 2, 3]
    assert graph.max_rows == 2
    assert graph.note.startswith("decode steps of <= 2 rows compiled; larger ones run eager")

    # One request's drafts: the same row counts over one request's copy, after the rest;
    # where one fails to compile, one request's drafts are left to eager steps
    shapes: list[tuple[int, int]] = []

    def one_request_fails(model, ids, positions, rows, loc, flat, pool_k, pool_v, dense_k, _v):
        shapes.append((ids.shape[0], dense_k[0].shape[0]))
        if dense_k[0].shape[0] == 1 and ids.shape[0] > 1:
            raise RuntimeError("LoweringException: one request")

    drafts = compiled.CompiledDecode(net, 64, drafts=True)
    drafts._step = one_request_fails
    drafts.warm_up(pool)
    assert shapes == [(1, 1), (2, 2), (3, 3), (2, 1)]
    assert drafts.max_rows == 64 and not drafts.verifies_one_request
    assert drafts.note.startswith("one request's drafts are verified eager (RuntimeError at 2")


def test_a_cached_graph_of_a_narrower_span_leaves_no_compile_to_a_step(tiny_llama_dir, tmp_path):
    """Inductor's cache from a start whose int4 limit was 4 rows holds a graph guarded for 2
    to 4 rows. A start whose limit is 8 warms each span up at its last count first, so that
    graph is not taken for 2 to 8, and a step of 6 requests compiles nothing (it compiled
    inside the step when the warm-up traced 2 rows first: seconds, on the real model)."""
    cache = tmp_path / "inductor"
    net, pool = int4_blocks_up_to_two_rows(tiny_llama_dir, rows=4)
    compiled.CompiledDecode.build(net, pool, 5, cache, aot=False)
    net, pool = int4_blocks_up_to_two_rows(tiny_llama_dir, rows=8)
    graph = compiled.CompiledDecode.build(net, pool, 9, cache, aot=False)
    assert graph.row_spans() == [(2, 8), (9, 9)] and graph.warm_up_rows() == [1, 8, 2, 9]
    example = graph._example(pool, 6, 6)
    before = graphs_compiled()
    with torch.inference_mode():
        graph._step(net, *example)
    assert graphs_compiled() == before


def test_a_row_limit_of_two_compiles_its_one_row_count_static(tiny_llama_dir, tmp_path):
    """int4 blocks for at most 2 rows (a verdict some starts measure): the span from 2 rows
    holds one count, which Dynamo's graph and the drafts package take static (marked
    symbolic, Dynamo refused it, and every step past one row ran eager)."""
    net, pool = int4_blocks_up_to_two_rows(tiny_llama_dir)
    depth = sys.getrecursionlimit()
    graph = compiled.CompiledDecode.build(net, pool, 4, tmp_path / "inductor", drafts=True)
    assert sys.getrecursionlimit() == depth
    assert graph.note is None and graph.max_rows == 4 and graph.verifies_one_request
    assert graph._single is not None and graph._drafts.max_tokens == 2


def test_a_form_that_cannot_compile_caps_the_rows_without_a_trace(tiny_llama_dir):
    """Where a linear's form for larger steps cannot be compiled (WeightForm.compiles), the
    graph takes the steps below it, and nothing is traced for the others; where every
    step's form cannot, there is no compiled step at all."""
    from stemma.runtime.models.layers import Linear, compiled_row_limit
    from stemma.runtime.models.loader import load_decoder
    from stemma.runtime.models.weights import Int4Weight
    from stemma.runtime.models.weights.dense import PlainWeight
    from stemma.runtime.models.weights.few_rows import FewRowsWeight
    from stemma.runtime.weight_plan import WeightPlan

    class Untraceable(PlainWeight):
        compiles = False

    net, _ = load_decoder(tiny_llama_dir, torch.float32, "cpu")
    plan = WeightPlan()
    linears = [m for m in net.layers.modules() if isinstance(m, Linear)]
    assert compiled_row_limit(net.layers) is None
    for m in linears:
        m.hold(FewRowsWeight(Int4Weight.from_weight(m.weight, plan), 3, Untraceable(m.weight)))
    assert compiled_row_limit(net.layers) == 3
    graph = compiled.CompiledDecode(net, 64)
    assert graph.max_rows == 3 and graph.warm_up_rows() == [1, 3, 2]  # the span 2-3, last first
    assert "steps of <= 3 rows compiled" in graph.note
    assert compiled.CompiledDecode(net, 2).note is None  # under the limit: nothing left out
    linears[0].hold(Untraceable(linears[0].form.many.weight))
    assert compiled_row_limit(net.layers) == 0
    with pytest.raises(ValueError, match="cannot trace"):
        compiled.CompiledDecode(net, 64)


def test_packed_weights_run_in_the_graph_and_give_eager_tokens(
    tiny_llama_dir, tmp_path, monkeypatch
):
    """oneDNN-packed weights (the bfloat16 plan's, opaque to Dynamo) are multiplied in the
    graph by number (weights/dense.py), so the graph takes every step, of any row count, the
    batch's, and one request's drafts run their package (which calls the same weights).
    Packed in float32 here, which every x86 CPU packs, so the compiled tokens are eager's
    (their logprobs to float32 rounding)."""
    from stemma.runtime import engine_core
    from stemma.runtime.models.layers import Linear, compiled_row_limit
    from stemma.runtime.weight_plan import WeightPlan

    monkeypatch.setattr(engine_core, "plan_weights", lambda *a, **k: WeightPlan("packed", "plain"))
    loop = [5, 9, 23, 7, 11, 40, 3, 8]
    params = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    outs, calls = {}, []
    for compile_on in (False, True):
        cfg = {"dtype": "float32", "kv_cache_mb": 16, "enable_torch_compile": compile_on}
        cfg |= {"cache_dir": str(tmp_path / "cache"), "speculative_algorithm": "NGRAM"}
        with Engine(model_path=str(tiny_llama_dir), **cfg) as e:
            linears = [m for m in e.runner.model.layers.modules() if isinstance(m, Linear)]
            assert {m.form.name for m in linears} == {"packed"}
            if compile_on:
                graph = e.runner.model.compiled
                assert compiled_row_limit(e.runner.model.layers) is None
                assert graph.max_rows == 64 and graph.verifies_one_request
                graph._step = lambda *a, g=graph._step: (
                    calls.append((a[1].shape[0], a[8][0].shape[0])) or g(*a)
                )
                graph._drafts = CountedPackage(graph._drafts, calls)
                graph._batch = CountedPackage(graph._batch, calls, "batch")
                e.core.outputs.budget.cost = FlatCost()
            out = e.generate(
                input_ids=[loop * 4, *PROMPTS],
                sampling_params=[params] * (1 + len(PROMPTS)),
                return_logprob=True,
            )
            out += [e.generate(input_ids=loop * 4, sampling_params=params, return_logprob=True)]
        outs[compile_on] = out
    assert [o["output_ids"] for o in outs[True]] == [o["output_ids"] for o in outs[False]]
    for a, b in zip(outs[True], outs[False]):
        got = [x[0] for x in a["meta_info"]["output_token_logprobs"]]
        want = [x[0] for x in b["meta_info"]["output_token_logprobs"]]
        assert got == pytest.approx(want, abs=1e-4)
    assert (4, "batch") in calls  # the batch's decode steps, their package
    assert any(isinstance(r, int) and t > r > 1 for t, r in calls)  # several requests' drafts
    assert any(t > 1 and r == "package" for t, r in calls)  # one request's drafts


def test_two_models_of_one_shape_in_one_process_each_get_their_own_graph(tmp_path):
    """The graphs do not guard on the model (decode_graph.unguarded_model), so each engine's
    must be its own: two models of the same shapes whose weights and constants differ (norm
    eps, RoPE base), compiled in one process, each give what their eager engine gives."""
    from ..fixtures import build_tiny_checkpoint

    ckpts = [
        build_tiny_checkpoint(tmp_path / "a", seed=0),
        build_tiny_checkpoint(tmp_path / "b", seed=1, rms_norm_eps=0.5, rope_theta=50.0),
    ]
    params = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}

    def outputs(cfg: dict) -> list:
        """Each model's logprobs, its engine started with `cfg` while the other's runs too."""
        engines = [Engine(model_path=str(c), **cfg) for c in ckpts]
        try:
            outs = [e.generate(input_ids=PROMPTS[2], sampling_params=params,
                               return_logprob=True) for e in engines]  # fmt: skip
        finally:
            for e in engines:
                e.shutdown()
        return [[x[0] for x in o["meta_info"]["output_token_logprobs"]] for o in outs]

    base = {"dtype": "float64", "kv_cache_mb": 8, "cache_dir": str(tmp_path / "cache")}
    got = outputs(base | {"enable_torch_compile": True, "torch_compile_max_bs": 1})
    want = outputs(base)
    assert want[0] != pytest.approx(want[1], abs=1e-3)  # the two models differ
    for a, b in zip(got, want):
        assert a == pytest.approx(b, abs=2e-5)


def test_the_one_row_package_is_kept_by_what_it_holds(tiny_llama_dir, tmp_path, monkeypatch):
    """The one-row package (compiled_aot.py) is loaded, not built, at a second start with
    the same weights, and gives the same step; it holds no copy of them (the model's are
    lent to it, so a package reads a weight changed in place); weights that differ by one
    value get a package of their own, whose step follows them; a package is kept unpacked
    and read in place, so nothing is left in the temp dir (from a zip, the loader unpacks a
    copy there, which a killed process leaves behind), and one kept zipped, as earlier
    versions did, is unpacked once; without it, Dynamo's graph takes one
    row (aot=False, or a package that fails to build, which says why)."""
    from stemma.runtime.executor import compiled_aot
    from stemma.runtime.executor.memory import KVPool
    from stemma.runtime.models.loader import load_decoder

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))

    net, _ = load_decoder(tiny_llama_dir, torch.float64, "cpu")
    cfg = net.cfg
    pool = KVPool(64, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, torch.float64)
    cache = tmp_path / "inductor"
    torch.manual_seed(0)
    with torch.inference_mode():
        dense = [torch.randn(1, 9, cfg.num_kv_heads, cfg.head_dim, dtype=torch.float64)
                 for _ in range(2 * cfg.num_layers)]  # fmt: skip
    half = cfg.num_layers
    small = [torch.tensor([7]), torch.tensor([5]), torch.tensor([0]), torch.tensor([9])]  # row 0

    def step(graph) -> torch.Tensor:
        flat = torch.tensor([5])
        args = (*small, flat, pool.k, pool.v, dense[:half], dense[half:])
        with torch.inference_mode():
            return graph._single(compiled_aot.inputs(*args)).clone()

    with torch._inductor.config.patch({"aot_inductor.metadata": {}}):
        first = compiled.CompiledDecode.build(net, pool, 1, cache)
        # the build leaves Inductor's settings, which Dynamo's cache keys hold, as they were
        assert torch._inductor.config.aot_inductor.metadata == {}
    again = compiled.CompiledDecode.build(net, pool, 1, cache)
    assert first._single.built and not again._single.built
    assert again._single.path == first._single.path
    with torch.inference_mode():
        want = decode_graph.decode_graph(net, *small, torch.tensor([5]), pool.k, pool.v,
                                     dense[:half], dense[half:])  # fmt: skip
    assert torch.allclose(step(first), want, atol=1e-6) and torch.equal(step(again), step(first))
    # the library holds no weights: the model's own tensors are lent to it, and the package
    # keeps only the constants Inductor made
    package = first._single
    assert package.constants["model.norm.weight"].data_ptr() == net.norm.weight.data_ptr()
    pickled = [f for f in package.path.rglob("*") if f.parent.name == "weights" and f.is_file()]
    assert package.lent and len(pickled) == len(package.constants) - len(package.lent)
    before = step(first)
    with torch.no_grad():
        net.norm.weight[0] += 1.0
    changed = compiled.CompiledDecode.build(net, pool, 1, cache)
    assert changed._single.built and changed._single.path != first._single.path
    with torch.inference_mode():
        want = decode_graph.decode_graph(net, *small, torch.tensor([5]), pool.k, pool.v,
                                     dense[:half], dense[half:])  # fmt: skip
    assert torch.allclose(step(changed), want, atol=1e-6) and not torch.allclose(want, before)
    assert torch.equal(step(first), step(changed))  # it reads the weights in place
    kept = sorted(p.name for p in (tmp_path / "aot").iterdir())  # no partial file, no work dir
    assert kept == sorted(p.name for p in (first._single.path, changed._single.path))
    assert list(temp.iterdir()) == []  # nothing unpacked into the temp dir
    # a package kept as a zip (a top folder holding the package's files), as before: the
    # next start unpacks it in place of the zip and loads it, building nothing
    folder = changed._single.path
    zipped = folder.with_name(folder.name + ".pt2")
    with zipfile.ZipFile(zipped, "w") as z:
        for f in sorted(folder.rglob("*")):
            if f.is_file():
                z.write(f, "built/" + f.relative_to(folder).as_posix())
    shutil.rmtree(folder)
    migrated = compiled.CompiledDecode.build(net, pool, 1, cache)
    assert not migrated._single.built and migrated._single.path == folder
    assert not zipped.exists() and torch.equal(step(migrated), step(changed))
    assert list(temp.iterdir()) == []

    assert compiled.CompiledDecode.build(net, pool, 1, cache, aot=False)._single is None
    graph = compiled.CompiledDecode(net, 1)
    graph.aot_dir = tmp_path / "aot"
    rows: list = []
    graph._step = lambda model, ids, *rest: rows.append((ids.shape[0], rest[-1][0].shape[0]))

    def fail(*args, **kwargs):
        raise RuntimeError("g++ not found\nmore")

    orig, compiled.build_package = compiled.build_package, fail
    try:
        graph.warm_up(pool)
        assert graph._single is None and rows == [(1, 1)]  # Dynamo's graph took the row
        assert graph.note == (
            "one-row steps run through Dynamo's graph (RuntimeError building their "
            "AOTInductor package: g++ not found)"
        )
        rows.clear()  # with drafts: Dynamo's graph takes one request's too
        graph = compiled.CompiledDecode(net, 2, drafts=True)
        graph.aot_dir = tmp_path / "aot"
        graph._step = lambda model, ids, *rest: rows.append((ids.shape[0], rest[-1][0].shape[0]))
        graph.warm_up(pool)
    finally:
        compiled.build_package = orig
    assert graph._single is None and graph._drafts is None
    assert rows == [(1, 1), (2, 2), (2, 1)]
    assert graph.note == (
        "one request's drafts run through Dynamo's graph (RuntimeError building their "
        "AOTInductor package: g++ not found)"
    )


def test_the_least_recently_used_packages_go_past_the_bound(tmp_path):
    """prune_packages keeps aot/ within its bound: the packages least recently used (by
    their folders' times, which each load sets) go first, never one the start uses, and a
    build's work folder goes once it is an hour old (a process that died left it)."""
    from stemma.runtime.executor.compiled_aot import prune_packages

    aot, now = tmp_path / "aot", time.time()
    for age, name in enumerate(["newest", "used", "middle", "oldest"]):
        (aot / name / "data").mkdir(parents=True)
        (aot / name / "data" / "lib.so").write_bytes(b"x" * 1000)
        os.utime(aot / name, (now - 100 * age, now - 100 * age))
    (aot / "decode-1row-old.pt2").write_bytes(b"z" * 500)  # a zip of an earlier version
    os.utime(aot / "decode-1row-old.pt2", (now - 50, now - 50))
    for name, age in (("tmp-build-dead", 7200), ("tmp-build-busy", 60)):
        (aot / name).mkdir()
        (aot / name / "built.pt2").write_bytes(b"y" * 5000)
        os.utime(aot / name, (now - age, now - age))

    removed = prune_packages(aot, keep={aot / "used"}, max_bytes=2500)
    assert removed == ["oldest", "middle"]  # "used" is older than the zip but kept
    assert sorted(p.name for p in aot.iterdir()) == [
        "decode-1row-old.pt2", "newest", "tmp-build-busy", "used"]  # fmt: skip
    assert prune_packages(aot, keep=set(), max_bytes=1 << 20) == []  # within the bound
    assert prune_packages(aot, keep=set(), max_bytes=0) == ["used", "decode-1row-old.pt2", "newest"]
    assert [p.name for p in aot.iterdir()] == ["tmp-build-busy"]
