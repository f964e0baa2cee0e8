"""The compile service: non-blocking submit, de-duplication, memory and disk caches, and limits
that fail one request with a clear error while other compiles go on."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from stemma.runtime.constrained import vocabulary
from stemma.runtime.constrained.service import (
    OUTLINES_CORE_VERSION,
    GrammarHandle,
    GrammarService,
)
from stemma.runtime.constrained.spec import ConstraintSpec
from stemma.runtime.constrained.vocabulary import CompileLimits
from stemma.runtime.faults import Faults

# Compact JSON, one string of up to 200 characters: a 66 MiB index that takes seconds to build.
HUGE = ConstraintSpec.create(
    json_schema={"type": "object", "properties": {"a": {"type": "string", "maxLength": 200}}}
)


def _ready(handle: Any) -> Any:
    assert handle.wait(120), "compile did not finish"
    return handle


# Real compiles in these tests finish in milliseconds (a fresh worker in well under a second);
# the limit is only a bound on a hang, never waited for on the pass path.
GENEROUS_S = 60.0


class HangClock:
    """The compile worker's clock under the hang switch (vocabulary.time): the hung compile's
    wait for its timeout returns when the test says so, not after wall-clock seconds."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.waited: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.waited.append(seconds)
        assert self.release.wait(120), "the test never released the hung compile"


@pytest.fixture
def hang_clock(monkeypatch: pytest.MonkeyPatch) -> HangClock:
    clock = HangClock()
    monkeypatch.setattr(vocabulary, "time", clock)
    return clock


def test_submit_returns_at_once_and_dedupes_in_flight(
    smollm_vocab: Any, hang_clock: HangClock
) -> None:
    faults = Faults(enabled=True)
    faults.arm("compile_hang")  # the first compile cannot finish until the test releases it
    limits = CompileLimits(timeout_s=GENEROUS_S)
    with GrammarService(
        smollm_vocab, cache_dir=None, num_workers=1, limits=limits, faults=faults
    ) as svc:
        first = svc.submit(r"[0-9]{3}-[0-9]{4}")
        second = svc.submit(ConstraintSpec(regex=r"[0-9]{3}-[0-9]{4}"))
        assert first is second and not first.ready()  # returned while the compile runs
        hang_clock.release.set()
        assert "longer than the 60 s limit" in _ready(first).error
        assert hang_clock.waited == [GENEROUS_S]
    with GrammarService(smollm_vocab, cache_dir=None, num_workers=1) as svc:
        first = _ready(svc.submit(r"[0-9]{3}-[0-9]{4}"))
        assert first.error is None and svc.stats.compiles == 1
        # Ready immediately from memory; each matcher is independent.
        third = svc.submit(r"[0-9]{3}-[0-9]{4}")
        assert third.ready() and third is not first and svc.stats.memory_hits == 1
        a, b = first.matcher(), third.matcher()
        a.accept_token(a.grammar.vocab.single_byte_ids()[ord("5")])
        assert a.state != b.state


def test_matcher_before_ready_raises() -> None:
    with pytest.raises(RuntimeError, match="not compiled yet"):
        GrammarHandle(ConstraintSpec(regex="a")).matcher()


def test_specs_resolving_to_one_regex_share_the_index(smollm_vocab: Any) -> None:
    with GrammarService(smollm_vocab, cache_dir=None, num_workers=1) as svc:
        x = _ready(svc.submit(ConstraintSpec.create(choices=["yes", "no"])))
        y = _ready(svc.submit("(yes|no)"))
        assert x.matcher().grammar is y.matcher().grammar
        assert svc.stats.compiles == 1


def test_disk_cache_survives_a_restart_and_recovers_from_corruption(
    smollm_vocab: Any, tmp_path: Path
) -> None:
    regex = r"(0|[1-9][0-9]*)\.[0-9]{2}"
    with GrammarService(smollm_vocab, cache_dir=tmp_path) as svc:
        cold = _ready(svc.submit(regex))
        assert svc.stats.compiles == 1
    (path,) = tmp_path.glob("*.idx")
    assert path.name.endswith(f"-{smollm_vocab.fingerprint[:16]}-oc{OUTLINES_CORE_VERSION}.idx")
    with GrammarService(smollm_vocab, cache_dir=tmp_path) as svc:
        warm = _ready(svc.submit(regex))
        assert (svc.stats.compiles, svc.stats.disk_hits) == (0, 1)
        assert (
            warm.matcher().grammar.index.get_transitions()
            == cold.matcher().grammar.index.get_transitions()
        )
    path.write_bytes(path.read_bytes()[:-10])
    with GrammarService(smollm_vocab, cache_dir=tmp_path) as svc:
        assert _ready(svc.submit(regex)).error is None
        assert (svc.stats.compiles, svc.stats.disk_hits) == (1, 0)


def test_memory_cache_is_bounded_by_bytes(smollm_vocab: Any) -> None:
    with GrammarService(smollm_vocab, cache_dir=None, max_memory_cache_bytes=1) as svc:
        _ready(svc.submit("(a|b)"))
        _ready(svc.submit("(c|d)"))
        assert not svc.submit("(a|b)").ready()  # evicted: compiles again


def test_bad_inputs_fail_their_own_handles_only(smollm_vocab: Any, hang_clock: HangClock) -> None:
    """A compile past the time limit (the hang switch: one worker, so the first job takes
    it; its timeout comes from the test's clock), bad patterns and refused keywords each
    fail their own handle only. The other compiles, a restarted worker's included, have a
    limit no machine's real compile comes near."""
    faults = Faults(enabled=True)
    faults.arm("compile_hang")
    hang_clock.release.set()  # the hung compile times out as soon as it starts waiting
    limits = CompileLimits(timeout_s=GENEROUS_S)
    with GrammarService(
        smollm_vocab, cache_dir=None, limits=limits, num_workers=1, faults=faults
    ) as svc:
        huge = svc.submit(HUGE)
        bad_regex = svc.submit("(a|b")
        lookaround = svc.submit("(?=a)a")
        unsupported = svc.submit(
            ConstraintSpec.create(json_schema={"type": "integer", "minimum": 0})
        )
        good = svc.submit(
            ConstraintSpec.create(json_schema={"type": "array", "items": {"type": "boolean"}})
        )
        assert _ready(good).error is None
        assert "outlines backend cannot compile" in _ready(bad_regex).error
        assert "lookahead" in _ready(lookaround).error
        assert "#: minimum" in _ready(unsupported).error
        assert "longer than the 60 s limit" in _ready(huge).error
        assert faults.fired["compile_hang"] == 1 and hang_clock.waited == [GENEROUS_S]
        with pytest.raises(ValueError, match="60 s limit"):
            huge.matcher()
        # The worker that was killed comes back for the next compile; failures are remembered.
        assert _ready(svc.submit("[a-z]{2}")).error is None
        again = svc.submit(HUGE)
        assert again.ready() and again.error == huge.error


def test_index_size_limit(smollm_vocab: Any) -> None:
    limits = CompileLimits(max_index_bytes=1 << 20, timeout_s=GENEROUS_S)
    spec = ConstraintSpec.create(
        json_schema={"type": "object", "properties": {"a": {"type": "string", "maxLength": 20}}}
    )
    with GrammarService(smollm_vocab, cache_dir=None, limits=limits, num_workers=1) as svc:
        assert "over the limit of 1 MiB" in _ready(svc.submit(spec)).error
        assert "characters, over the limit" in _ready(svc.submit("a" * 300_000)).error


def test_memory_limit_kills_only_the_compile_worker(smollm_vocab: Any) -> None:
    # The worker must die of its memory limit, not of a build that a slow CPU takes long over.
    limits = CompileLimits(max_memory_bytes=260 << 20, timeout_s=GENEROUS_S)
    with GrammarService(smollm_vocab, cache_dir=None, limits=limits, num_workers=1) as svc:
        assert "memory limit" in _ready(svc.submit(HUGE)).error
        assert _ready(svc.submit("(yes|no)")).error is None


def test_non_strict_schema_surfaces_warnings(smollm_vocab: Any) -> None:
    spec = ConstraintSpec.create(json_schema={"type": "integer", "maximum": 9}, strict=False)
    with GrammarService(smollm_vocab, cache_dir=None, num_workers=1) as svc:
        handle = _ready(svc.submit(spec))
        assert handle.error is None
        assert handle.warnings == ["ignored: #: maximum"]
