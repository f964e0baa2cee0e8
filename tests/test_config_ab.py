"""bench/config_ab.py gives the candidate's fresh cache the baseline's kept speed verdicts, so
both engines of an A/B hold their weights alike (a verdict measured again at the candidate's
start fell the other way: 8 int4 rows in one engine, 4 in the other)."""

from __future__ import annotations

from pathlib import Path

import pytest
from stemma.bench.config_ab import share_verdicts
from stemma.runtime import measured


def test_the_candidate_reads_the_baselines_verdicts(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(measured, "KEEP", True)
    base = measured.KeptMeasurements(tmp_path / "base" / "measured")
    assert base.value("own_int4_rows", ("packed", 576), lambda: 8) == 8
    cache = tmp_path / "candidate"
    copied = share_verdicts({"weight_measurements": base.summary()}, cache)
    assert copied is not None and copied.parent == cache / "measured"
    candidate = measured.KeptMeasurements(cache / "measured")
    assert candidate.value("own_int4_rows", ("packed", 576), lambda: pytest.fail("measured")) == 8
    assert candidate.kept == ["own_int4_rows('packed', 576)"] and not candidate.measured


def test_nothing_is_copied_where_the_baseline_keeps_none(tmp_path: Path) -> None:
    assert share_verdicts({"weight_measurements": None}, tmp_path) is None
    gone = {"path": str(tmp_path / "gone.json"), "kept": [], "measured": []}
    assert share_verdicts({"weight_measurements": gone}, tmp_path) is None
    assert not (tmp_path / "measured").exists()
