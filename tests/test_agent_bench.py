"""bench/agents' bookkeeping: the recorder's records, the offline optimum, the ratio table."""

from __future__ import annotations

from stemma.bench.agent_report import ratio_table
from stemma.bench.agent_trace import GenRecord, Recorder, optimum_hit_rate, summarize


class _Streaming:
    def generate_stream(self, req):
        yield {"text": "ab"}
        yield {
            "text": "abcd",
            "meta_info": {"prompt_tokens": 4, "cached_tokens": 3, "completion_tokens": 4},
        }

    def generate(self, req):
        meta = {"prompt_tokens": 2, "cached_tokens": 1}
        return [{"text": "", "meta_info": meta} for _ in req["input_ids"]]


def test_recorder_times_gens_and_keeps_other_prompts():
    recorder = Recorder(_Streaming())
    out = recorder.generate({"text": "hi", "sampling_params": {"max_new_tokens": 4}})
    recorder.generate({"input_ids": [[1, 2], [1, 3]], "sampling_params": {"max_new_tokens": 0}})
    assert out["text"] == "abcd"
    gen, *scored = recorder.records
    assert gen.prompt == "hi" and gen.ttft_s is not None and gen.completion_tokens == 4
    assert [r.prompt for r in scored] == [[1, 2], [1, 3]]
    stats = summarize(recorder.records, seconds=2.0, num_programs=1)
    assert stats["num_gens"] == 1 and stats["output_tok_s"] == 2.0
    assert stats["cache_hit_rate"] == round(5 / 8, 4)


def _record(prompt, output=""):
    return GenRecord(0.0, None, 0.0, 0, 0, 0, prompt, output)


def test_optimum_counts_prefixes_of_earlier_prompts_and_outputs():
    records = [_record("abc", "de"), _record("abcdx"), _record([7, 8])]
    for i, r in enumerate(records):
        r.start = float(i)
    # "abcdx" shares "abcd" with the first prompt + output; [7, 8] shares nothing.
    assert optimum_hit_rate(records, lambda text: [ord(c) for c in text]) == round(4 / 10, 4)


def test_ratio_table_divides_by_each_baseline():
    rows = [
        {
            "program": "p",
            "system": "stemma",
            "programs_per_s": 3.0,
            "cache_hit_rate": 0.5,
            "optimum_hit_rate": 0.6,
        },
        {"program": "p", "system": "llama.cpp", "programs_per_s": 1.0},
        {"program": "p", "system": "hf-naive", "programs_per_s": None, "num_errors": 2},
    ]
    table = ratio_table(rows)
    assert "| p | 3 | 3.00x | — | 0.500 (0.600) |" in table
