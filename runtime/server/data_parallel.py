"""`stemma serve --dp-size N`: N stemma servers on loopback ports behind SGLang's own router
(`sglang-router`, policy cache_aware: a request goes to the worker whose radix cache holds
the longest part of its prompt). The router is the front door on --host/--port; the workers
take port+1 .. port+N. SIGINT / SIGTERM stop the router, then the workers. With --api-key the
router requires it too (its /add_worker and /remove_worker included) and sends it to the
workers; without one, anyone who reaches the router may add workers and read what it forwards.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request

from .auth import LOOPBACK_BINDS

log = logging.getLogger("stemma.server")
ROUTER_HINT = "the router is an optional dependency: pip install 'stemma-lm[router]'"


def router_command(
    worker_urls: list[str], host: str, port: int, api_key: str | None = None
) -> list[str]:
    """The one-line router launch in front of stemma workers started anywhere; with api_key
    the router requires `Authorization: Bearer api_key` and sends it to the workers."""
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *worker_urls,
           "--policy", "cache_aware", "--host", host, "--port", str(port)]  # fmt: skip
    return cmd + ["--api-key", api_key] if api_key is not None else cmd


def warn_if_exposed(host: str, api_key: str | None) -> None:
    """The router on a non-loopback address forwards prompts and keys to the workers: say so."""
    if host in LOOPBACK_BINDS:
        return
    if api_key is None:
        log.warning(
            "the router listens on %s without --api-key: anyone who reaches it can send "
            "prompts and add workers (/add_worker)", host
        )  # fmt: skip
    else:
        log.warning(
            "the router listens on %s: the API key and prompts cross the network in clear "
            "text; put TLS in front of it", host
        )  # fmt: skip


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 900.0) -> None:
    """Poll url/health until 200; RuntimeError if proc exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited with code {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} was not healthy within {timeout_s:.0f} s")


def serve_dp(
    worker_argv: list[str], dp_size: int, host: str, port: int, api_key: str | None = None
) -> int:
    """Start dp_size `stemma serve worker_argv` processes (which carry --api-key, if any) and
    the router; block until a signal or until any of them exits."""
    if importlib.util.find_spec("sglang_router") is None:
        raise SystemExit(f"--dp-size {dp_size}: {ROUTER_HINT}")
    warn_if_exposed(host, api_key)
    threads = ["--num-threads", str(max(1, (os.cpu_count() or 1) // dp_size))]
    if "--num-threads" in worker_argv:
        threads = []
    ports = [port + 1 + i for i in range(dp_size)]
    procs: list[subprocess.Popen] = []
    stop = {"now": False}

    def on_signal(signum: int, frame: object) -> None:
        stop["now"] = True

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for p in ports:
            cmd = [
                sys.executable,
                "-m",
                "stemma",
                "serve",
                *worker_argv,
                *threads,
                "--port",
                str(p),
            ]
            procs.append(subprocess.Popen(cmd))
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        for url, proc in zip(urls, procs):
            wait_healthy(url, proc)
        procs.insert(0, subprocess.Popen(router_command(urls, host, port, api_key)))
        log.info("router on %s:%d in front of %s", host, port, " ".join(urls))
        while not stop["now"] and all(p.poll() is None for p in procs):
            time.sleep(0.2)
    finally:
        for proc in procs:  # the router first: it stops taking requests
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(40)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0
