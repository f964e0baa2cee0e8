"""JSON-schema coverage on real-world schemas (JSONSchemaBench's MaskBench scoring).

A schema is ok when the system compiles it and, for every test instance, the instance's tokens
(compact JSON, `json.dumps(data, separators=(",", ":"), ensure_ascii=False)`, tokenized by
SmolLM2's tokenizer), serialized the way the system emits JSON, are all allowed with a final
state at the end exactly when the instance is valid. The way it emits JSON: where the system
refuses an instance as written, its objects' keys are put in an order the system allows
(engine_order.py; `--key-order given` scores the instances as written only; a system that
takes keys in any order, `stemma-llguidance-any`, emits the instance's own order too). The summary
counts the instances decided by that order apart (`valid_in_engine_order`: valid, accepted only
reordered; `invalid_in_engine_order`: invalid, accepted reordered, part of `invalid_accepted`).
Per group and total: schemas ok, refused (by reason), valid instances refused, invalid
instances accepted, compile p50/p90/max. Systems: stemma with each grammar backend (through
stemma.Constraint, compiles bounded by the service's time limit; `stemma-llguidance-any`:
property_order "any", keys in any order), and llguidance / xgrammar alone as references.
`llguidance-stemma-grammar` times llguidance alone on the grammar stemma resolves each schema
to (as written or rewritten; resolved before the clock starts, without what stemma enforces
beside the grammar, so uniqueItems is not checked): what stemma's compile would cost with no
Python of its own.
Each system runs in a worker process, the systems interleaved schema by schema (the first
system rotating), so a noisy machine slows them alike; a schema running past
--schema-timeout-s (compile and tests) kills the worker and counts as "timeout". Besides the
groups and the total, the row "common" takes the schemas every system in the run compiled:
compile times over the same schemas, where the total's percentiles range over different ones.

    python -m stemma.bench.schema_coverage --data ../shared/data/jsonschemabench/sample.jsonl
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import multiprocessing as mp
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .common import append_results, print_table
from .engine_order import (
    LLGuidanceWalk,
    SearchCut,
    StepWalk,
    XGrammarWalk,
    compact,
    in_engine_order,
)

SYSTEMS = (
    "stemma-outlines",
    "stemma-llguidance",
    "stemma-llguidance-any",
    "llguidance",
    "llguidance-stemma-grammar",
    "xgrammar",
)
MODEL = "smollm2-135m"
# per schema, beside valid_refused / invalid_accepted: the instances decided only with their
# keys in the system's order, and the searches for one cut at their bound
_REORDERED = ("valid_in_engine_order", "invalid_in_engine_order", "search_cut")
_COUNTS = dict.fromkeys(("valid_refused", "invalid_accepted", *_REORDERED), 0)


def reason_of(error: str) -> str:
    """A short refusal label: the keyword named, a limit, or the error's first words."""
    if "took longer than" in error:
        return "compile timeout"
    if "has no valid instance" in error or error.startswith("Unsatisfiable schema"):
        return "unsatisfiable"
    if re.match(r"pattern has \d+ characters, over the limit", error):
        return "regex size limit"
    if m := re.search(r"keyword '([^']+)'", error):
        return m.group(1)
    if m := re.search(r"would silently ignore.*?: #[^:]*: (\w+)", error):
        return m.group(1)
    if m := re.search(r'Unimplemented keys: \["([^"]+)"', error):
        return m.group(1)
    error = re.sub(r"^\[[0-9:]+\] \S+:\d+: ", "", error)  # xgrammar's log prefix
    return " ".join(error.split()[:6])[:60]


class _Stemma:
    def __init__(self, backend: str, timeout_s: float, property_order: str) -> None:
        import stemma

        self.Constraint, self.backend, self.timeout_s = stemma.Constraint, backend, timeout_s
        self.property_order = property_order
        # keys in any order: the instance's own order is one the system emits
        self.any_key_order = property_order == "any"
        # the same time limit as the compiles: one service, built before any is timed
        self.tokenizer = self.Constraint(regex="x", backend=backend, timeout_s=timeout_s).tokenizer

    def compile(self, schema: Any) -> Any:
        return self.Constraint(
            json_schema=schema,
            backend=self.backend,
            timeout_s=self.timeout_s,
            property_order=self.property_order,
        )

    def accepts(self, compiled: Any, ids: list[int]) -> bool:
        return compiled.accepts(ids)

    def walk(self, compiled: Any) -> StepWalk:
        return StepWalk(compiled.matcher)


class _LLGuidance:
    """llguidance alone, its LLTokenizer built from the tokenizer's own JSON as stemma builds
    it: a process that also holds transformers' tokenizer compiles 13-30% slower (p90 4.5-5.4
    against 4.0 ms over stemma's grammars, AMD EPYC), which would bill llguidance for it."""

    any_key_order = False

    def __init__(self, tokenizer: Any) -> None:
        from ..runtime.constrained.llguidance_backend import ll_tokenizer

        self.tok = ll_tokenizer(tokenizer)

    def compile(self, schema: Any) -> Any:
        from llguidance import LLMatcher

        options = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
        return self.matcher(
            LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=options)
        )

    def matcher(self, grammar: str) -> Any:
        """llguidance's matcher of `grammar`; ValueError with its first line of error."""
        from llguidance import LLMatcher

        matcher = LLMatcher(self.tok, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error().splitlines()[0])
        return matcher

    def accepts(self, compiled: Any, ids: list[int]) -> bool:
        m = compiled.deep_copy()
        return m.consume_tokens(ids) and m.is_accepting()

    def walk(self, compiled: Any) -> StepWalk:
        return LLGuidanceWalk(compiled.deep_copy)


class _StemmaGrammar(_LLGuidance):
    """llguidance alone on the grammar stemma resolves a schema to (`prepare`, untimed)."""

    def prepare(self, schema: Any) -> str:
        from ..runtime.constrained.llguidance_backend import resolved_grammar
        from ..runtime.constrained.spec import ConstraintSpec

        return resolved_grammar(ConstraintSpec.create(json_schema=schema))

    def compile(self, grammar: Any) -> Any:
        return self.matcher(grammar)


class _XGrammar:
    any_key_order = False

    def __init__(self, hf: Any) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=len(hf))
        self.compiler = xgr.GrammarCompiler(info, max_threads=1)
        self.eos = hf.eos_token_id

    def compile(self, schema: Any) -> Any:
        try:
            return self.compiler.compile_json_schema(
                json.dumps(schema), any_whitespace=False, separators=(",", ":"), strict_mode=False
            )
        except RuntimeError as err:  # xgrammar reports unsupported schemas this way
            raise ValueError(str(err).splitlines()[0] if str(err) else "RuntimeError") from err

    def accepts(self, compiled: Any, ids: list[int]) -> bool:
        m = self.xgr.GrammarMatcher(compiled)
        return all(m.accept_token(t) for t in ids) and m.accept_token(self.eos)

    def walk(self, compiled: Any) -> StepWalk:
        return XGrammarWalk(lambda: self.xgr.GrammarMatcher(compiled), self.eos)


def _make(system: str, timeout_s: float) -> tuple[Any, Any]:
    """(evaluator, tokenize) for one system, inside its worker."""
    if system.startswith("stemma-"):
        backend, _, order = system.removeprefix("stemma-").partition("-")
        ev = _Stemma(backend, timeout_s, order or "schema")
        return ev, ev.tokenizer.encode
    from ..runtime.models.loader import resolve_checkpoint

    if system in ("llguidance", "llguidance-stemma-grammar"):
        from ..runtime.tokenizer import Tokenizer

        tokenizer = Tokenizer(resolve_checkpoint(MODEL))
        kind = _LLGuidance if system == "llguidance" else _StemmaGrammar
        return kind(tokenizer), tokenizer.encode
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(resolve_checkpoint(MODEL)))
    return _XGrammar(hf), lambda text: hf.encode(text, add_special_tokens=False)


def _version(package: str) -> str | None:
    """The installed version, or None (xgrammar comes with the bench extra only)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _worker(system: str, timeout_s: float, key_order: str, conn: Any) -> None:
    ev, tokenize = _make(system, timeout_s)
    conn.send("ready")
    while (job := conn.recv()) is not None:
        schema, tests = job
        try:
            prepared = ev.prepare(schema) if hasattr(ev, "prepare") else schema
            t0 = time.perf_counter()
            compiled = ev.compile(prepared)
        except (ValueError, TypeError) as err:
            conn.send({"status": "refused", "reason": reason_of(str(err)), "error": str(err)})
            continue
        compile_s = time.perf_counter() - t0
        decided = Counter()
        for test in tests:
            accepted = ev.accepts(compiled, tokenize(compact(test["data"])))
            if not accepted and key_order == "engine" and not ev.any_key_order:
                try:
                    accepted = in_engine_order(test["data"], ev.walk(compiled), tokenize)
                except SearchCut:
                    decided["search_cut"] += 1
                kind = "valid" if test["valid"] else "invalid"
                decided[f"{kind}_in_engine_order"] += accepted
            decided["valid_refused"] += test["valid"] and not accepted
            decided["invalid_accepted"] += (not test["valid"]) and accepted
        conn.send({"status": "compiled", "compile_s": compile_s, **_COUNTS, **decided})


class _Runner:
    """One system's worker process; restarted after a schema runs past the limit."""

    def __init__(
        self, system: str, timeout_s: float, schema_timeout_s: float, key_order: str
    ) -> None:
        self.system, self.timeout_s, self.schema_timeout_s = system, timeout_s, schema_timeout_s
        self.key_order = key_order
        self.proc: Any = None

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_worker, args=(self.system, self.timeout_s, self.key_order, child)
        )
        self.proc.start()
        assert self.conn.recv() == "ready"

    def run(self, schema: Any, tests: list[dict[str, Any]]) -> dict[str, Any]:
        if self.proc is None:
            self._start()
        self.conn.send((schema, tests))
        if self.conn.poll(self.schema_timeout_s):
            return self.conn.recv()
        self.close()
        return {"status": "refused", "reason": "schema timeout", "error": "timeout"}

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.join()
            self.proc = None


def summarize(system: str, group: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    compiled = [r for r in results if r["status"] == "compiled"]
    ok = [r for r in compiled if not r["valid_refused"] and not r["invalid_accepted"]]
    times = sorted(r["compile_s"] * 1000 for r in compiled)
    refused = Counter(r["reason"] for r in results if r["status"] == "refused")

    def pct(q: float) -> float | None:
        return round(times[min(len(times) - 1, int(q * len(times)))], 2) if times else None

    return {
        "system": system,
        "group": group,
        "schemas": len(results),
        "ok": len(ok),
        "ok_pct": round(100 * len(ok) / max(1, len(results)), 1),
        "refused": sum(refused.values()),
        "refused_by_reason": dict(refused.most_common()),
        "wrong": len(compiled) - len(ok),
        "valid_refused": sum(r["valid_refused"] for r in compiled),
        "invalid_accepted": sum(r["invalid_accepted"] for r in compiled),
        **{k: sum(r.get(k, 0) for r in compiled) for k in _REORDERED},
        "compile_p50_ms": pct(0.5),
        "compile_p90_ms": pct(0.9),
        "compile_max_ms": round(times[-1], 2) if times else None,
    }


def run_systems(systems: list[str], rows: list[dict[str, Any]], args: Any) -> list[dict]:
    """Every system over every row, interleaved row by row; the summary rows."""
    runners = [
        _Runner(s, args.compile_timeout_s, args.schema_timeout_s, args.key_order) for s in systems
    ]
    results: list[list[dict[str, Any]]] = [[] for _ in systems]
    try:
        for i, row in enumerate(rows):
            for k in range(len(systems)):
                j = (i + k) % len(systems)
                results[j].append(
                    {"group": row["group"], **runners[j].run(row["schema"], row["tests"])}
                )
    finally:
        for runner in runners:
            runner.close()
    return summaries(systems, results)


def summaries(systems: list[str], results: list[list[dict[str, Any]]]) -> list[dict]:
    """Per system: a row per group, the total, and "common" (the schemas, by position, that
    every system compiled)."""
    common = [
        i for i in range(len(results[0])) if all(r[i]["status"] == "compiled" for r in results)
    ]
    out = []
    for system, mine in zip(systems, results):
        groups = sorted({r["group"] for r in mine})
        out += [summarize(system, g, [r for r in mine if r["group"] == g]) for g in groups]
        out.append(summarize(system, "total", mine))
        out.append(summarize(system, "common", [mine[i] for i in common]))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="MaskBench-style JSONL")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"subset of {SYSTEMS}")
    ap.add_argument("--limit", type=int, default=None, help="first N schemas only")
    ap.add_argument("--compile-timeout-s", type=float, default=10.0, help="stemma's limit")
    ap.add_argument("--schema-timeout-s", type=float, default=30.0, help="compile + tests")
    ap.add_argument(
        "--key-order",
        choices=("engine", "given"),
        default="engine",
        help="instances the system refuses as written: tried with their keys in an order it "
        "emits (engine, MaskBench's rule), or scored as written (given)",
    )
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args(argv)
    rows = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()]
    rows = rows[: args.limit]
    systems = [s for s in args.systems.split(",") if s]
    if unknown := set(systems) - set(SYSTEMS):
        raise SystemExit(f"unknown systems {sorted(unknown)}; choose from {SYSTEMS}")
    summary = run_systems(systems, rows, args)
    columns = ["system", "group", "schemas", "ok", "refused", "wrong", "valid_refused"]
    columns += ["invalid_accepted", "valid_in_engine_order", "invalid_in_engine_order"]
    columns += ["compile_p50_ms", "compile_p90_ms", "compile_max_ms"]
    print_table([r for r in summary if r["group"] in ("total", "common")], columns)
    if not args.no_record:
        versions = {p: _version(p) for p in ("llguidance", "xgrammar", "outlines_core")}
        extra = {"data": args.data.name, "num_schemas": len(rows), "versions": versions}
        extra |= {"compile_timeout_s": args.compile_timeout_s, "key_order": args.key_order}
        path = append_results("schema_coverage", summary, **extra)
        print(f"appended {len(summary)} rows to {path}")


if __name__ == "__main__":
    main()
