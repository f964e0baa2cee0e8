"""The soak's record and verdict: what every request and sample showed, the checks over it,
the summary row (bench/results/soak.jsonl) and the plot (soak.py runs the load)."""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .soak_traffic import EXPECTED_ERRORS, Outcome

RSS_JUDGED_MINUTES = 10.0
FAULTS = ("forward_error", "compile_kill", "compile_hang")


@dataclass
class Record:
    """Everything the run saw, for the checks and the plot."""

    start: float = field(default_factory=time.monotonic)
    outcomes: Counter[str] = field(default_factory=Counter)
    by_scenario: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    latency: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    bad: list[dict[str, Any]] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)  # expected errors, by message
    samples: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)

    def add(self, scenario: str, outcome: Outcome, seconds: float) -> None:
        self.outcomes[outcome.status] += 1
        self.by_scenario[scenario][outcome.status] += 1
        self.latency[scenario].append(seconds)
        if outcome.status == "error":
            self.errors[re.sub(r"\d+", "N", f"{scenario}: {outcome.detail[:90]}")] += 1
        if outcome.status in ("bad", "hung") and len(self.bad) < 50:
            self.bad.append(
                {
                    "t": self.now(),
                    "scenario": scenario,
                    "status": outcome.status,
                    "detail": outcome.detail,
                }
            )

    def now(self) -> float:
        return round(time.monotonic() - self.start, 1)


# ---- verdict -----------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def verdict(args: argparse.Namespace, rec: Record, end: dict[str, Any], term: dict[str, Any]):
    samples = rec.samples
    # RSS growth counts from 5 minutes in: the first minutes grow the allocator's pools and
    # the caches (about 1.1 -> 1.5 GiB here), so a run shorter than RSS_JUDGED_MINUTES
    # records its growth without judging it.
    warm_t = min(300.0, args.minutes * 60 / 6)
    warm = [s["rss_mb"] for s in samples if s["t"] >= warm_t][:3]
    last = [s["rss_mb"] for s in samples][-3:]
    base = statistics.median(warm) if warm else 0.0
    growth = (statistics.median(last) - base) / base if base else 0.0
    violations = [s for s in samples if not s["memory"].get("invariant_ok", False)]
    unhealthy = [s for s in samples if s["health"] != 200]
    fault_kinds = {f["kind"] for f in rec.faults if f["armed"]}
    checks = {
        "no_invariant_violation": not violations,
        "no_leaked_slots": end["leaked_slots"] == 0 and end["rows_leaked"] == 0,
        "flush_empties_pool": end["free_after_flush"] == end["capacity"],
        "rss_growth_under_5pct": growth < 0.05 if args.minutes >= RSS_JUDGED_MINUTES else None,
        "no_hung_request": rec.outcomes["hung"] == 0,
        "no_bad_response": rec.outcomes["bad"] == 0,
        "healthy_throughout": not unhealthy and end["health_generate"] == 200,
        "every_fault_fired": fault_kinds == set(FAULTS) or args.minutes * 60 < 3 * args.fault_every,
        "retraction_happened": max((s.get("retractions", 0) for s in samples), default=0) > 0,
        "sigterm_clean": term["exit_code"] == 0
        and not term["orphans"]
        and not any(k.startswith(("bad", "transport")) for k in term["request_ends"]),
    }
    latency = {
        name: {
            "n": len(v),
            "p50_s": round(percentile(v, 0.5), 3),
            "p99_s": round(percentile(v, 0.99), 3),
        }
        for name, v in sorted(rec.latency.items())
    }
    summary = {
        "workload": f"soak {args.profile} {args.minutes:g} min",
        "minutes": args.minutes,
        "seed": args.seed,
        "concurrency": args.concurrency,
        "kv_tokens": args.kv_tokens,
        "passed": all(v is not False for v in checks.values()),  # None: not judged
        "checks": checks,
        "outcomes": dict(rec.outcomes),
        "by_scenario": {k: dict(v) for k, v in sorted(rec.by_scenario.items())},
        "errors": dict(rec.errors.most_common(30)),
        "latency": latency,
        "rss_mb_at_warm": round(base, 1),
        "rss_mb_end": round(statistics.median(last), 1) if last else 0.0,
        "rss_growth": round(growth, 4),
        "retractions": max((s.get("retractions", 0) for s in samples), default=0),
        "invariant_violations": [s["memory"] for s in violations][:5],
        "unhealthy_samples": len(unhealthy),
        "faults": rec.faults,
        "end": end,
        "sigterm": term,
        "bad_examples": rec.bad[:20],
        "expected_error_markers": list(EXPECTED_ERRORS),
    }
    return summary


def plot(rec: Record, path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'stemma-lm[bench]'): no plot")
        return
    t = [s["t"] / 60 for s in rec.samples]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    ax1.plot(t, [s["rss_mb"] for s in rec.samples], label="server RSS")
    ax1.plot(t, [s["children_rss_mb"] for s in rec.samples], label="compile workers' RSS")
    ax1.set_ylabel("MiB")
    ax1.legend(loc="upper left")
    for f in rec.faults:
        ax1.axvline(f["t"] / 60, color="red", alpha=0.3, lw=1)
    mem = [s["memory"] for s in rec.samples]
    ax2.plot(t, [m.get("free", 0) for m in mem], label="free slots")
    ax2.plot(t, [m.get("evictable", 0) for m in mem], label="evictable")
    ax2.plot(t, [m.get("private", 0) + m.get("locked", 0) for m in mem], label="in use")
    ax2.set_xlabel("minutes (red lines: injected faults)")
    ax2.set_ylabel("KV slots")
    ax2.legend(loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
