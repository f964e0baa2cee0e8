"""bench/drafts_ab.py: one engine runs each round with its speculative draft sources and
without them, and only the side with them drafts; greedy float64 outputs agree."""

from __future__ import annotations

import json
from pathlib import Path

from stemma.bench import common, drafts_ab


def test_one_engine_drafts_on_one_side_only(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    argv = ["--prompt", "rewrite", "--batches", "2", "--rounds", "2", "--new", "12"]
    drafts_ab.main([*argv, "--dtype", "float64"])
    (row,) = [json.loads(line) for line in (tmp_path / "drafts_ab.jsonl").read_text().splitlines()]
    assert row["drafted_on"] > 0 and row["drafted_off"] == 0
    assert row["same_outputs"] == 1.0
    assert len(row["seconds"]["on"]) == len(row["seconds"]["off"]) == 2
    assert row["engine"] == {} and row["batch"] == 2 and row["dtype"] == "float64"
