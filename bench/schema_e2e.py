"""Structured outputs end to end: how many real-world schemas yield output that validates.

    python -m stemma.bench.schema_e2e --data ../shared/data/jsonschemabench/sample.jsonl

Each schema of the JSONSchemaBench sample that the llguidance backend accepts is asked for
once, greedy, under its own json_schema with max_new_tokens 512, with early closing on and
off (same engine, the two runs of a chunk interleaved; `--early-closing on` or `off` runs
one side only). The prompt is the chat template over "Reply with a JSON value for this JSON
schema:" and the schema's text (its first 3,000 characters). An output counts when
`jsonschema` validates it; failures are sorted by reason (cut at the length limit: not JSON;
JSON that `jsonschema` refuses; aborted; or a schema `jsonschema` cannot resolve, not
counted either way), and each failed schema is named. `--failures-out FILE` also writes
each failed output (its text and token ids, finish reason and whether early closing
completed it) as a JSON line, so a failure seen in a batch can be read without running it again.
Results: a table and JSON lines in bench/results/schema_e2e.jsonl.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .common import append_results, print_table

MODEL = "smollm2-135m"
PROMPT_SCHEMA_CHARS = 3000


def accepted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows whose schema the llguidance backend compiles."""
    import stemma

    keep = []
    for row in rows:
        try:
            stemma.Constraint(json_schema=row["schema"], backend="llguidance")
        except ValueError:
            continue
        keep.append(row)
    return keep


def verdict(schema: Any, out: dict[str, Any]) -> str:
    """ "valid", or why not."""
    import jsonschema

    kind = out["meta_info"]["finish_reason"]["type"]
    if kind == "abort":
        return "aborted"
    try:
        value = json.loads(out["text"])
    except json.JSONDecodeError:
        return "cut at the length limit" if kind == "length" else "not JSON"
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    try:
        errors = list(cls(schema).iter_errors(value))
    except (jsonschema.exceptions.RefResolutionError, jsonschema.exceptions.SchemaError):
        return "schema unresolvable"
    except Exception as err:  # noqa: BLE001 - a referencing failure, named
        return f"schema unresolvable ({type(err).__name__})"
    return "valid" if not errors else "refused by jsonschema"


def generate(
    engine: Any, prompts: list[str], params: list[dict], rows: list, chunk: range
) -> list[tuple[str, dict[str, Any] | None]]:
    """(verdict, output) for one chunk; a request the engine refuses (a bound, say) is judged
    alone, with no output."""
    try:
        outs = engine.generate(prompts, params)
    except ValueError:
        out: list[tuple[str, dict[str, Any] | None]] = []
        for prompt, p, i in zip(prompts, params, chunk):
            try:
                one = engine.generate(prompt, p)
                out.append((verdict(rows[i]["schema"], one), one))
            except ValueError as err:
                out.append((f"refused by the engine: {str(err)[:60]}", None))
        return out
    return [(verdict(rows[i]["schema"], o), o) for i, o in zip(chunk, outs)]


def failure_line(row: dict[str, Any], on: bool, why: str, out: dict[str, Any] | None) -> str:
    """One failed output as a JSON line (--failures-out)."""
    meta = (out or {}).get("meta_info", {})
    finish = meta.get("finish_reason") or {}
    return json.dumps(
        {
            "name": f"{row.get('group')}/{row.get('name')}",
            "early_closing": on,
            "verdict": why,
            "finish_reason": finish.get("type"),
            "closed_early": bool(meta.get("closed_early")),
            "completion_tokens": meta.get("completion_tokens"),
            "text": None if out is None else out["text"],
            "output_ids": None if out is None else out.get("output_ids"),
        }
    )


def failed_names(
    rows: list[dict[str, Any]], verdicts: list[str], start: int = 0
) -> dict[str, list[str]]:
    """By reason, the schemas whose output failed: `group/name` (the sample's fields), or
    the schema's line among those run (`start` + its index here) where the row has no name."""
    failed: dict[str, list[str]] = {}
    for i, (row, v) in enumerate(zip(rows, verdicts)):
        if v != "valid":
            name = f"{row['group']}/{row['name']}" if "name" in row else f"#{start + i}"
            failed.setdefault(v, []).append(name)
    return failed


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from ..runtime.engine import Engine

    rows = accepted([json.loads(line) for line in args.data.open()][: args.limit][:: args.every])
    modes = {"both": (True, False), "on": (True,), "off": (False,)}[args.early_closing]
    verdicts: dict[bool, list[str]] = {on: [] for on in modes}
    seconds = {on: 0.0 for on in modes}
    failures_out = None if args.failures_out is None else args.failures_out.open("w")
    with Engine(MODEL, dtype=args.dtype, grammar_backend="llguidance") as engine:
        prompts = [
            engine.apply_chat_template(
                [
                    {
                        "role": "user",
                        "content": "Reply with a JSON value for this JSON schema:\n"
                        + json.dumps(r["schema"])[:PROMPT_SCHEMA_CHARS],
                    }
                ]
            )
            for r in rows
        ]
        for start in range(0, len(rows), args.chunk):
            chunk = range(start, min(start + args.chunk, len(rows)))
            for on in modes if start % 2 == 0 else modes[::-1]:
                params = [
                    {
                        "json_schema": json.dumps(rows[i]["schema"]),
                        "max_new_tokens": args.max_new_tokens,
                        "temperature": 0,
                        "close_early": on,
                    }
                    for i in chunk
                ]
                t = time.perf_counter()
                judged = generate(engine, [prompts[i] for i in chunk], params, rows, chunk)
                seconds[on] += time.perf_counter() - t
                verdicts[on] += [why for why, _ in judged]
                for i, (why, out) in zip(chunk, judged):
                    if failures_out is not None and why != "valid":
                        print(failure_line(rows[i], on, why, out), file=failures_out, flush=True)
            done = len(verdicts[modes[0]])
            counts = ", ".join(
                f"{verdicts[on].count('valid')} (closing {'on' if on else 'off'})" for on in modes
            )
            print(f"{done}/{len(rows)}: valid {counts}", flush=True)
            for on in modes:  # this chunk's failures, named as they happen
                got = verdicts[on][chunk.start :]
                for reason, names in failed_names(rows[chunk.start :], got, chunk.start).items():
                    side = "on" if on else "off"
                    print(f"  closing {side}, {reason}: {', '.join(names)}", flush=True)
    if failures_out is not None:
        failures_out.close()
    results = []
    for on in modes:
        counts = Counter(verdicts[on])
        judged = len(rows) - sum(
            v for k, v in counts.items() if k.startswith("schema unresolvable")
        )
        results.append(
            {
                "early_closing": on,
                "schemas": len(rows),
                "judged": judged,
                "valid": counts["valid"],
                "valid_pct": round(100 * counts["valid"] / max(judged, 1), 1),
                "failures": {k: v for k, v in counts.items() if k != "valid"},
                "failed": failed_names(rows, verdicts[on]),
                "max_new_tokens": args.max_new_tokens,
                "seconds": round(seconds[on], 1),
            }
        )
    return results


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", type=Path, required=True, help="MaskBench-style JSONL")
    ap.add_argument("--limit", type=int, default=None, help="first N schemas only")
    ap.add_argument("--every", type=int, default=1, help="every Nth schema only (a sample)")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=32, help="requests per engine.generate")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument(
        "--early-closing",
        choices=["both", "on", "off"],
        default="both",
        help="run with early closing on and off (interleaved by chunk), or one of them",
    )
    ap.add_argument(
        "--failures-out", type=Path, default=None, help="write each failed output here (JSONL)"
    )
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args(argv)
    results = run(args)
    print_table(results, ["early_closing", "schemas", "judged", "valid", "valid_pct", "seconds"])
    for r in results:
        print(f"early closing {'on' if r['early_closing'] else 'off'}: {r['failures']}")
        for reason, names in r["failed"].items():
            print(f"  {reason}: {', '.join(names)}")
    if not args.no_record:
        append_results("schema_e2e", results, data=args.data.name, every=args.every)


if __name__ == "__main__":
    main()
