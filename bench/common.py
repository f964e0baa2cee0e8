"""What every benchmark records beside its numbers: machine, versions, commit, command."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff for more than a century. Every night its "
    "lamp turned slowly, sweeping a pale beam across the black water, warning ships away from "
    "the rocks below. The keeper climbed the narrow stairs each evening to trim the wick and "
    "polish the great lens, and wrote every storm and every passing ship into his log book."
)
REWRITE_ASK = f"Repeat this paragraph word for word.\n\n{PARAGRAPH}"  # the rewrite case

# The anchors' workloads of one request (bench/anchors.py), each ask marked by a salt so that
# no two share a cached answer; drafts_ab runs them too (--prompt)
PASSAGE = (
    "The lighthouse keeper climbed the spiral stairs each evening, counting the steps "
    "aloud, polishing the great lens, and writing the weather into a leather log book. "
)
CODE = '''import json
from pathlib import Path


def parse_config(path, defaults=None):
    """Read a JSON config file and fill in the defaults it does not set."""
    settings = dict(defaults or {})
    text = Path(path).read_text(encoding="utf-8")
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be an object")
    for key, value in data.items():
        if key.startswith("_"):
            continue
        settings[key] = value
    return settings


def merge_configs(paths, defaults=None):
    """Parse every config in order; later files win."""
    merged = dict(defaults or {})
    for path in paths:
        merged.update(parse_config(path))
    return merged


def save_config(path, settings):
    """Write the settings back, sorted, with a trailing newline."""
    text = json.dumps(settings, indent=2, sort_keys=True)
    Path(path).write_text(text + "\\n", encoding="utf-8")
    return len(text)
'''
ANCHOR_ASKS: dict[str, Callable[[object], str]] = {
    "single": lambda salt: f"({salt}) " + PASSAGE + "Continue this story for a while.",
    "free": lambda salt: (
        f"({salt}) List some questions a child might ask about the night sky, with answers."
    ),
    "rewrite": lambda salt: (
        f"({salt}) Rewrite this code with the function parse_config renamed to load_config. "
        f"Reply with the whole code only.\n\n```python\n{CODE}```"
    ),
}


def git_commit() -> str:
    """HEAD's short hash (-dirty with local changes); STEMMA_BENCH_COMMIT names it where the
    tree was copied without its git history (bench/gpu_check.sh on a lent GPU machine)."""
    if os.environ.get("STEMMA_BENCH_COMMIT"):
        return os.environ["STEMMA_BENCH_COMMIT"]
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        # Results appended by an earlier run do not make the code dirty.
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", ".", ":!bench/results"],
            cwd=root,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


def cpu_model() -> tuple[str, list[str]]:
    """The CPU's model name ("unknown" where /proc/cpuinfo gives none: the architecture,
    hardware()'s "arch", is no model name) and the instruction sets that decide stemma's CPU
    paths."""
    name, flags = "unknown", set[str]()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    isa = [label for label, flag in ISA_FLAGS if flag in flags]
    return name, isa


ISA_FLAGS = [
    ("AVX2", "avx2"),
    ("AVX-512", "avx512f"),
    ("AVX512-BF16", "avx512_bf16"),
    ("AMX", "amx_tile"),
]


def hardware() -> dict[str, Any]:
    import torch

    name, isa = cpu_model()
    return {
        "cpu": name,
        "arch": platform.machine(),
        "isa": isa,
        "native_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        "num_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_avg_1m": os.getloadavg()[0],
    }


def median_time(fn: Callable[[], object], repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def cpu_ticks() -> tuple[int, int] | None:
    """(all, stolen) CPU ticks since boot from /proc/stat; None where there is none."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(fields), fields[7] if len(fields) > 7 else 0


def interleaved_times(
    fns: dict[str, Callable[[], object]],
    repeats: int,
    steal: dict[str, list[float]] | None = None,
) -> dict[str, list[float]]:
    """Seconds of each fn per round. Every round runs each fn once, in alternating order
    (A B, B A, ...), so that drifts in machine load hit every candidate alike. With `steal`,
    each run's share of CPU time the hypervisor gave to other guests is recorded there
    (a VM's noise made visible)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    items = list(fns.items())
    for r in range(repeats):
        for name, fn in items if r % 2 == 0 else reversed(items):
            before = cpu_ticks()
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
            after = cpu_ticks()
            if steal is not None and before and after:
                total = max(1, after[0] - before[0])
                steal.setdefault(name, []).append(round((after[1] - before[1]) / total, 3))
    return times


def interleaved_medians(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each fn over interleaved rounds (see interleaved_times)."""
    return {name: statistics.median(ts) for name, ts in interleaved_times(fns, repeats).items()}


def rss_mb(pid: int) -> float:
    """A process's resident memory (Linux /proc), in MB; NaN where /proc does not say."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def paired_speedup(baseline: list[float], candidate: list[float]) -> float:
    """Median over rounds of baseline / candidate seconds. The two runs of a round are
    adjacent in time and share its machine load, so on a noisy machine this ratio is far
    steadier than a ratio of medians."""
    return statistics.median(b / c for b, c in zip(baseline, candidate, strict=True))


class EngineProcess:
    """An Engine in a child process of its own, called over a pipe. An A/B of two engines
    holds one per process: two Engines in one process each keep an OpenMP team on their
    threads, more OpenMP threads than cores, and every parallel region then waits on a futex
    (runtime/engine.py), on both sides of the A/B. An idle child's threads sleep and take no
    CPU from the one that runs."""

    def __init__(self, model: str, **options: Any) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # no copy of this process's threads
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve_engine, args=(child, model, options), daemon=True)
        self._proc.start()
        child.close()
        self._reply()  # the load's outcome: raises what the constructor raised

    @property
    def pid(self) -> int:
        """The engine's process."""
        return self._proc.pid

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """engine.method(*args, **kwargs) in the child; its exception re-raised here."""
        self._conn.send((method, args, kwargs))
        return self._reply()

    def attr(self, path: str) -> Any:
        """A (dotted) attribute of the child's engine, e.g. "runner.plan.linear_form"."""
        return self.call("__attr__", path)

    def __getattr__(self, name: str) -> Any:
        """engine.name as the child has it: a method becomes a call over the pipe, any other
        attribute comes back as a copy (so `engine.generate(...)`, `engine.dtype.name` read as
        on an Engine; not thread-safe, one caller at a time)."""
        if name.startswith("_"):
            raise AttributeError(name)
        if self.call("__is_method__", name):
            return lambda *args, **kwargs: self.call(name, *args, **kwargs)
        return self.attr(name)

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        if self._proc.is_alive():
            self._conn.send(None)
            self._proc.join()

    def _reply(self) -> Any:
        ok, value = self._conn.recv()
        if not ok:
            raise RuntimeError(f"engine process: {value}")
        return value


def _serve_engine(conn: Any, model: str, options: dict[str, Any]) -> None:
    from functools import reduce

    from ..runtime.engine import Engine

    try:
        engine = Engine(model, **options)
    except Exception as e:  # noqa: BLE001 - handed to the parent, which raises it
        conn.send((False, f"{type(e).__name__}: {e}"))
        return
    conn.send((True, None))
    with engine:
        while (job := conn.recv()) is not None:
            method, args, kwargs = job
            try:
                if method == "__attr__":
                    value = reduce(getattr, args[0].split("."), engine)
                elif method == "__is_method__":
                    value = callable(getattr(engine, args[0]))
                else:
                    value = getattr(engine, method)(*args, **kwargs)
                conn.send((True, value))
            except Exception as e:  # noqa: BLE001 - handed to the parent, which raises it
                conn.send((False, f"{type(e).__name__}: {e}"))


def append_results(
    name: str,
    rows: list[dict[str, Any]],
    path: Path | None = None,
    command: str | None = None,
    **extra: Any,
) -> Path:
    """Append one JSON line per row, each stamped with hardware, commit and command (by
    default bench/results/NAME.jsonl and `python -m stemma.bench.NAME` with this process's
    arguments). `extra` goes into every line (versions, the GPU, ...). The one writer of
    results: every bench records the same stamp."""
    path = path or RESULTS_DIR / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "commit": git_commit(),
        "hardware": hardware(),
        "command": command or "python -m stemma.bench." + name + " " + " ".join(sys.argv[1:]),
        **extra,
    }
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps({**stamp, **row}) + "\n")
    return path


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)))


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def bench_parser(doc: str | None, dtype: str = "auto") -> argparse.ArgumentParser:
    """A bench's command line: its module docstring as the help, --model and --dtype."""
    p = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default=dtype)
    return p


def add_decode_rounds(p: argparse.ArgumentParser, batches: str) -> None:
    """The options of a decode A/B over rounds: --batches, --new, --rounds and --prompt
    (random 32-token prompts, chat requests to repeat a paragraph: the rewrite case, or the
    anchors' one-request workloads as chat requests: anchors-single, anchors-free,
    anchors-rewrite)."""
    p.add_argument("--batches", default=batches)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--prompt",
        choices=["random", "rewrite", *(f"anchors-{k}" for k in ANCHOR_ASKS)],
        default="random",
    )


def round_prompts(
    kind: str, batch: int, r: int, vocab_size: int, template: Callable, rng: Any
) -> dict[str, Any]:
    """One round's prompts, as generate's keyword arguments: random 32-token ones, or chat
    requests (through `template`, the engine's apply_chat_template) to repeat a paragraph or
    of one of the anchors' workloads (`anchors-NAME`; one request: the anchors' own text of
    round r), each marked with the round and its place so that no two share a cached
    answer."""
    if kind == "random":
        ids = [[rng.randrange(100, vocab_size) for _ in range(32)] for _ in range(batch)]
        return {"input_ids": ids}
    if kind.startswith("anchors-"):
        ask = ANCHOR_ASKS[kind.removeprefix("anchors-")]
        # one request: the anchors' own text for round r (their salt is the round)
        salts = [r] if batch == 1 else [f"{r}.{i}" for i in range(batch)]
        chats = [[{"role": "user", "content": ask(salt)}] for salt in salts]
        return {"text": [template(c) for c in chats]}
    chats = [[{"role": "user", "content": f"({r}.{i}) {REWRITE_ASK}"}] for i in range(batch)]
    return {"text": [template(c) for c in chats]}
