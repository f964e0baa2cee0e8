"""Weight-only int8 / int4: packed weights compute what their codes say, a Q4_1-shaped weight
re-quantizes to itself, and a quantized engine stays close to its float32 model."""

from __future__ import annotations

import pytest
import torch
from stemma.runtime.config import EngineConfig
from stemma.runtime.dtype_policy import MachineMeasurements
from stemma.runtime.models.weights import INT4_GROUP_SIZE, quantize
from stemma.runtime.weight_plan import plan_weights


def q4_1_like(out: int, inp: int, seed: int = 0) -> torch.Tensor:
    """A weight as a GGUF Q4_1 file stores it: per 32-column block, d * q + m, q in 0..15."""
    g = torch.Generator().manual_seed(seed)
    blocks = inp // INT4_GROUP_SIZE
    d = torch.rand(out, blocks, 1, generator=g) * 0.01 + 1e-3
    m = -8 * d + torch.randn(out, blocks, 1, generator=g) * 1e-3
    q = torch.randint(0, 16, (out, blocks, INT4_GROUP_SIZE), generator=g)
    q[..., 0], q[..., 1] = 0, 15  # the encoder's block minimum and maximum
    return (d * q + m).reshape(out, inp)


def vocab_form(method: str) -> str:
    """The vocabulary projection's form that the plan picks under `method` on this build."""
    return plan_weights(method, "float32", "cpu", MachineMeasurements(64, 128)).vocab_form


@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("rows", [1, 3, 32])
def test_matmul_equals_the_dequantized_weight(method, rows):
    w = torch.randn(96, 128) * 0.05
    qw = quantize(w, method)
    x = torch.randn(rows, 128)
    ref = x @ qw.dequantize().t()
    got = qw.matmul(x)
    assert got.dtype == torch.float32 and got.shape == (rows, 96)
    # The kernel rounds x to bfloat16 and accumulates in float32.
    torch.testing.assert_close(got, ref, atol=2e-2 * ref.abs().max().item(), rtol=0)


def _fake_quantized_engines(monkeypatch, engines: list[str]) -> None:
    """torch's list of quantized-kernel libraries, as another CPU's build would have it."""
    monkeypatch.setattr(
        type(torch.backends.quantized), "supported_engines", property(lambda self: engines)
    )


def _kernels(name: str):
    """A quantized-kernel library as a test parameter: skipped only where torch lacks it
    (x86 builds carry both fbgemm and qnnpack, ARM builds qnnpack only)."""
    present = name in torch.backends.quantized.supported_engines
    return pytest.param(name, marks=pytest.mark.skipif(not present, reason=f"no {name} here"))


@pytest.mark.parametrize("kernels", [_kernels("fbgemm"), _kernels("qnnpack")])
def test_w8a8_rounds_activations_per_step_and_weights_per_channel(kernels, monkeypatch):
    """int8 x int8: the result is the dequantized weight times each input row rounded to
    7-bit steps of its own range, so a row of small values keeps its precision beside a
    row of large ones. With x86's kernels and with ARM's (qnnpack, also in x86 builds;
    it rounds to 8 bits, finer than the bound)."""
    from stemma.runtime.models.weights import quantized

    monkeypatch.setattr(torch.backends.quantized, "engine", torch.backends.quantized.engine)
    monkeypatch.setattr(quantized, "quantized_engine", lambda: kernels)
    w = torch.randn(96, 128) * 0.05
    qw = quantize(w, "w8a8_int8")
    weight = qw.dequantize()
    assert (weight - w).abs().amax() <= w.abs().amax() / 127
    for rows in (1, 8, 64):
        x = torch.randn(rows, 128) * torch.logspace(-3, 1, rows)[:, None]
        got = qw.matmul(x)
        assert got.dtype == torch.float32 and got.shape == (rows, 96)
        err = (got - x @ weight.t()).abs().amax(dim=1)
        step = 2 * x.abs().amax(dim=1) / 127  # per row, reduce_range: 7 bits
        assert (err <= step / 2 * weight.abs().sum(dim=1).amax() + 1e-6).all()
        assert (err > 0).all()  # the activations really are rounded
    x16 = torch.randn(3, 128, dtype=torch.bfloat16)
    assert qw.matmul(x16).dtype == torch.bfloat16


def test_quantized_kernel_choice_follows_the_build(monkeypatch):
    """Which kernels w8a8_int8 and its vocabulary projection use, for each kind of torch
    build, on any machine (the list of kernel libraries is faked)."""
    from stemma.runtime.dtype_policy import fp16_weights_available
    from stemma.runtime.models.weights.quantized import quantized_engine

    _fake_quantized_engines(monkeypatch, ["qnnpack", "onednn", "x86", "fbgemm"])  # x86
    assert quantized_engine() == "fbgemm" and fp16_weights_available()
    assert vocab_form("w8a8_int8") == "fp16"
    _fake_quantized_engines(monkeypatch, ["qnnpack"])  # ARM
    assert quantized_engine() == "qnnpack" and not fp16_weights_available()
    assert vocab_form("w8a8_int8") == "int8"
    assert vocab_form("int4") == "int8" and vocab_form("int8") == "int8"
    _fake_quantized_engines(monkeypatch, [])  # neither
    assert quantized_engine() is None
    with pytest.raises(ValueError, match="w8a8_int8 needs torch's fbgemm"):
        quantize(torch.randn(8, 32), "w8a8_int8")


def test_w8a8_smoothing_tames_outlier_input_channels():
    """A few input channels 50x larger than the rest (as LLM activations have) set the 7-bit
    activation step; smoothing by the calibrated range moves them into the weights."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 256, generator=g) * 0.05
    x = torch.randn(16, 256, generator=g)
    x[:, :4] *= 50
    ref = x @ w.t()
    plain = quantize(w, "w8a8_int8")
    smoothed = quantize(w, "w8a8_int8", input_max=x.abs().amax(dim=0))
    err_plain = (plain.matmul(x) - ref).norm() / ref.norm()
    err_smoothed = (smoothed.matmul(x) - ref).norm() / ref.norm()
    assert err_smoothed < err_plain / 2


def test_calibration_sees_every_linear(tiny_llama_dir):
    from stemma.runtime.executor.calibrate import calibration_ids, input_maxima
    from stemma.runtime.models.layers import Linear
    from stemma.runtime.models.loader import load_model

    loaded = load_model(str(tiny_llama_dir))
    ids = calibration_ids(loaded.tokenizer, loaded.config.vocab_size)
    maxima = input_maxima(loaded.model, ids)  # the vocabulary projection stays weight-only
    model = loaded.model
    linears = [m for m in model.modules() if isinstance(m, Linear) and m is not model.lm_head]
    assert linears and set(maxima) == set(linears)
    for linear, seen in maxima.items():
        assert seen.shape == (linear.weight.shape[1],) and (seen > 0).all()


def test_int8_error_is_per_channel_small():
    w = torch.randn(64, 256) * torch.logspace(-3, 0, 64)[:, None]  # rows of very unlike scale
    err = (quantize(w, "int8").dequantize() - w).abs().amax(dim=1)
    assert (err <= w.abs().amax(dim=1) / 127).all()  # half a step, plus bf16 scale rounding


def test_int4_recovers_a_q4_1_weight_up_to_bfloat16_scales():
    w = q4_1_like(64, 256)
    rel = (quantize(w, "int4").dequantize() - w).norm() / w.norm()
    assert rel < 5e-3  # only the bfloat16 rounding of scale and zero
    gaussian = torch.randn(64, 256)
    rel_gauss = (quantize(gaussian, "int4").dequantize() - gaussian).norm() / gaussian.norm()
    assert rel_gauss > 10 * rel  # a weight that was not 4-bit loses far more


def test_bad_methods_and_shapes_are_refused():
    with pytest.raises(ValueError, match="quantization must be one of"):
        EngineConfig(quantization="fp8")
    with pytest.raises(ValueError, match="packed CPU kernels"):
        EngineConfig(quantization="int8", device="cuda")
    with pytest.raises(ValueError, match="divisible by 32"):
        quantize(torch.randn(8, 40), "int4")


@pytest.fixture(scope="module")
def tiny_q4_1_dir(tiny_llama_dir, tmp_path_factory):
    """The tiny checkpoint with every decoder linear snapped to a Q4_1 grid, as the built-in
    model's GGUF stores them (its embedding and lm_head stay float, like its Q8_0 table)."""
    import shutil

    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("tiny-q4_1")
    for f in tiny_llama_dir.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    for f in tiny_llama_dir.glob("*.safetensors"):
        tensors = load_file(f)
        for name, t in tensors.items():
            if t.dim() == 2 and ".layers." in name:
                tensors[name] = snap_to_q4_1(t)
        save_file(tensors, out / f.name, metadata={"format": "pt"})
    return out


def snap_to_q4_1(w: torch.Tensor) -> torch.Tensor:
    groups = w.reshape(w.shape[0], -1, INT4_GROUP_SIZE)
    lo, hi = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    d = (hi - lo) / 15
    return (torch.round((groups - lo) / d) * d + lo).reshape(w.shape)


@pytest.mark.parametrize(
    "method, build",
    [
        ("int8", "this"),
        ("int4", "this"),
        ("w8a8_int8", "this"),
        pytest.param("w8a8_int8", "arm", marks=_kernels("qnnpack").marks),
    ],
)
def test_quantized_engine_tracks_the_float32_model(
    tiny_q4_1_dir, make_prompts, method, build, monkeypatch
):
    """Teacher-forced on a model stored as Q4_1 (like the built-in one): at each prompt
    position the quantized model's top token is nearly always the float32 model's, and the
    prompt's logprobs stay close. (Random tiny weights have large, near-tied logits, so a
    few top tokens flip even under int8.) build "arm": w8a8_int8 as an ARM build runs it
    (qnnpack, and an int8 vocabulary projection for want of fbgemm's float16), on x86 too."""
    import stemma.runtime.dtype_policy as policy
    from stemma.runtime.engine import Engine
    from stemma.runtime.models.weights import quantized

    if build == "arm":
        monkeypatch.setattr(torch.backends.quantized, "engine", torch.backends.quantized.engine)
        monkeypatch.setattr(quantized, "quantized_engine", lambda: "qnnpack")
        monkeypatch.setattr(policy, "fp16_weights_available", lambda: False)

    prompts = make_prompts([17, 33, 64, 90], 300, seed=3)
    fields = {"return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 1}
    params = {"max_new_tokens": 1, "temperature": 0}
    tops, lps = {}, {}
    for quant in (None, method):
        with Engine(
            str(tiny_q4_1_dir), dtype="float32", quantization=quant, max_total_tokens=1024
        ) as engine:
            outs = engine.generate(input_ids=prompts, sampling_params=params, **fields)
            if quant:
                linear = engine.runner.model.layers[0].mlp.down_proj
                assert linear.weight is None and linear.form.name == method
                vocab = engine.runner.model.lm_head.form.name
                assert vocab == vocab_form(method)
        metas = [o["meta_info"] for o in outs]
        tops[quant] = [t[0][1] for m in metas for t in m["input_top_logprobs"][1:]]
        lps[quant] = torch.tensor([t[0] for m in metas for t in m["input_token_logprobs"][1:]])
    agree = sum(a == b for a, b in zip(tops[None], tops[method])) / len(tops[None])
    # measured on AVX2: 0.93 (int8), 0.965 (int4), 0.85 (w8a8_int8: int8 activations add
    # rounding of their own, 0.11 mean |delta logprob| against 0.05 for int8)
    assert agree >= (0.8 if method == "w8a8_int8" else 0.85)
    bound = 0.2 if method == "w8a8_int8" else 0.1
    assert (lps[None] - lps[method]).abs().mean().item() < bound
