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


def test_one_request_of_an_anchors_workload_is_the_anchors_text_of_that_round(monkeypatch) -> None:
    """--prompt anchors-NAME at batch 1 asks what bench/anchors.py asks in the same round
    (its salt is the round), so the two benches' outputs can be compared; a batch marks each
    request with the round and its place."""
    from stemma.bench import anchors

    asked = []

    def chat(client, url, messages, max_tokens):
        asked.append(messages)
        return "", 0

    monkeypatch.setattr(anchors, "chat", chat)
    anchors.run_rewrite(None, "", 3)

    def template(chat):
        return chat[0]["content"]

    one = common.round_prompts("anchors-rewrite", 1, 3, 100, template, None)
    assert one == {"text": [asked[0][0]["content"]]}
    batch = common.round_prompts("anchors-free", 2, 3, 100, template, None)["text"]
    assert batch == [common.ANCHOR_ASKS["free"]("3.0"), common.ANCHOR_ASKS["free"]("3.1")]
