"""dtype "auto" resolves by what the device runs natively; explicit slow dtypes warn with a
measured ratio; bad names are refused."""

from __future__ import annotations

import logging

import pytest
import torch
from stemma.runtime.config import EngineConfig
from stemma.runtime.dtype_policy import auto_dtype, cpu_has_native_bf16, resolve_dtype


def test_auto_on_cpu_is_bfloat16_only_where_native():
    choice = auto_dtype("cpu")
    assert choice.name == ("bfloat16" if cpu_has_native_bf16() else "float32")
    assert choice.reason.startswith("auto: ")
    assert resolve_dtype("auto", "cpu") == choice


def test_engine_config_defaults_to_auto_and_refuses_unknown_names():
    assert EngineConfig().dtype == "auto"
    with pytest.raises(ValueError, match="dtype must be one of"):
        EngineConfig(dtype="fp8")
    with pytest.raises(ValueError, match="got 'half'"):
        resolve_dtype("half", "cpu")


@pytest.mark.skipif(cpu_has_native_bf16(), reason="bfloat16 is native on this CPU")
def test_explicit_bfloat16_without_native_support_warns_with_a_measured_ratio(caplog):
    with caplog.at_level(logging.WARNING, logger="stemma.dtype"):
        choice = resolve_dtype("bfloat16", "cpu", hidden=256, inter=512)
    assert choice.torch_dtype == torch.bfloat16
    [record] = caplog.records
    assert "slower than in float32" in record.getMessage()
    assert "dtype='auto'" in record.getMessage()
    assert choice.reason.startswith("explicit; ")


def test_explicit_native_dtype_is_kept_without_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="stemma.dtype"):
        choice = resolve_dtype("float64", "cpu")
    assert choice.name == "float64" and choice.reason == "explicit"
    assert not caplog.records


def test_engine_reports_its_resolved_dtype(tiny_llama_dir):
    from stemma.runtime.engine import Engine

    with Engine(str(tiny_llama_dir), max_total_tokens=256) as engine:
        info = engine.get_model_info()
        assert info["dtype"] == auto_dtype("cpu").name
        assert info["dtype_reason"] == auto_dtype("cpu").reason
        assert engine.runner.kv_pool.k[0].dtype == auto_dtype("cpu").torch_dtype
