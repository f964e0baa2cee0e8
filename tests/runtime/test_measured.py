"""Speed verdicts kept across starts (runtime/measured.py): measured once per machine, read by
every later start and by starts beside it, measured again on another machine or where the
file cannot be read."""

from __future__ import annotations

import threading
import time

import pytest
from stemma.runtime import measured
from stemma.runtime.engine import Engine
from stemma.runtime.measured import KeptMeasurements

from .gguf_writer import write_gguf


@pytest.fixture
def keep(monkeypatch):
    monkeypatch.setattr(measured, "KEEP", True)  # conftest turns keeping off for other tests


class Counting:
    def __init__(self, verdict):
        self.verdict, self.calls = verdict, 0

    def __call__(self):
        self.calls += 1
        return self.verdict


def test_a_verdict_is_measured_once_and_read_by_later_starts(keep, tmp_path):
    first, measure = KeptMeasurements(tmp_path), Counting(4)
    assert first.value("own_int4_rows", ("packed", 576), measure) == 4
    assert first.value("own_int4_rows", ("packed", 576), measure) == 4
    assert measure.calls == 1
    later = KeptMeasurements(tmp_path)
    assert later.value("own_int4_rows", ("packed", 576), Counting(8)) == 4
    other_key = Counting(2)
    assert later.value("own_int4_rows", ("plain", 576), other_key) == 2 and other_key.calls == 1
    assert later.summary() == {
        "path": str(first.path),
        "kept": ["own_int4_rows('packed', 576)"],
        "measured": ["own_int4_rows('plain', 576)"],
    }
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".lock"]  # nothing partial


def test_another_machine_measures_again(keep, tmp_path, monkeypatch):
    assert KeptMeasurements(tmp_path).value("v", (), Counting(True)) is True
    identity = measured.machine_identity()
    monkeypatch.setattr(measured, "machine_identity", lambda: {**identity, "threads": 99})
    again = Counting(False)
    assert KeptMeasurements(tmp_path).value("v", (), again) is False and again.calls == 1


@pytest.mark.parametrize("text", ["{not json", '{"values": [1, 2]}', '{"other": 1}'])
def test_a_file_that_cannot_be_read_is_measured_over(keep, tmp_path, text, caplog):
    kept = KeptMeasurements(tmp_path)
    kept.path.write_text(text)
    measure = Counting(3)
    assert kept.value("v", (), measure) == 3 and measure.calls == 1
    assert "could not be read" in caplog.text
    assert KeptMeasurements(tmp_path).value("v", (), Counting(5)) == 3  # written whole again


def test_starts_beside_each_other_measure_once(keep, tmp_path):
    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.2)  # the other thread asks meanwhile, and waits on the lock
        return len(calls)

    got = []
    threads = [
        threading.Thread(target=lambda: got.append(KeptMeasurements(tmp_path).value("v", (), slow)))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1] and got == [1, 1, 1]


def test_nothing_is_kept_without_a_directory_or_under_the_tests_switch(tmp_path, monkeypatch):
    measure = Counting(1)
    none = KeptMeasurements(None)
    none.value("v", (), measure), none.value("v", (), measure)
    assert measure.calls == 2 and none.summary() is None
    monkeypatch.setattr(measured, "KEEP", False)
    off = KeptMeasurements(tmp_path)
    off.value("v", (), measure)
    assert measure.calls == 3 and list(tmp_path.iterdir()) == []


def test_a_second_engine_holds_the_weights_as_the_first_measured(
    keep, tiny_llama_dir, tmp_path, monkeypatch
):
    """The GGUF's own blocks up to the rows the first start measured (injected: 2); the second
    start reads that verdict, so holds its weights alike, without timing anything."""
    from stemma.runtime.models.weights import few_rows

    path = write_gguf(tiny_llama_dir, tmp_path / "model.gguf", "Q4_1")
    cache = str(tmp_path / "cache")
    monkeypatch.setattr(few_rows, "own_int4_rows", lambda *args, **kw: 2)
    first = Engine(model=str(path), cache_dir=cache)
    try:
        info = first.get_model_info()["weight_measurements"]
        assert info["measured"] and not info["kept"]
        assert any(s.startswith("own_int4_rows(") for s in info["measured"])
        assert info["path"].startswith(cache)
    finally:
        first.shutdown()
    monkeypatch.setattr(few_rows, "own_int4_rows", lambda *a, **k: pytest.fail("measured"))
    second = Engine(model=str(path), cache_dir=cache)
    try:
        info = second.get_model_info()
        assert info["weight_measurements"]["kept"] and not info["weight_measurements"]["measured"]
        assert "steps of <= 2 rows multiply the GGUF's own int4 blocks" in info["dtype_reason"]
        assert second.runner.plan.own_rows == 2
    finally:
        second.shutdown()
