"""The soak harness's 2-minute profile (opt in: pytest -m slow): the real server under the
hostile mix with every fault injected ends with every check passed (bench/soak.py; RSS growth
is judged only in runs of 10 minutes or more, past the allocator's warm-up)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_minute_soak_passes_every_check(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "stemma.bench.soak", "--profile", "ci", "--no-record"]
    cmd += ["--out", str(tmp_path), "--port", str(_free_port())]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert '"passed": true' in done.stdout
    assert (tmp_path / "soak_ci_series.json").exists()
