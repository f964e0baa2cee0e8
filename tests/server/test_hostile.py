"""Hostile requests against a real `stemma serve` process (bench/hostile.py's probe on the
tiny model): each gets its stated status, a 4xx with a JSON error, while a victim request
beside it succeeds, /health keeps answering 200 and the server's RSS grows by less than
100 MB. The server runs under an address-space limit, so a regression that makes one of
these requests allocate without bound fails this test instead of the machine.

/health is bounded here only as a hang (a blocked event loop held it for minutes); its 0.5 s
target is measured by `python -m stemma.bench.hostile`, since a test never bets on how fast
this CPU is."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from stemma.bench.hostile import HostileServer, probe, warm_up
from stemma.bench.hostile_corpus import HostileRequest, hostile_requests

HEALTH_HANG_S = 10.0
CASES = hostile_requests("hostile")


@pytest.fixture(scope="module")
def hostile_server(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    log_path = tmp_path_factory.mktemp("hostile") / "serve.log"
    extra = ["--dtype", "float32", "--max-total-tokens", "8192", "--grammar-timeout-s", "5"]
    server = HostileServer(str(tiny_llama_dir), log_path, extra)
    warm_up(server)
    yield server
    server.stop()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_request_is_refused_alone(
    hostile_server: HostileServer, case: HostileRequest
) -> None:
    result = probe(hostile_server, case)
    assert result.server_alive, hostile_server.tail()
    assert not result.problems(case, HEALTH_HANG_S), result
