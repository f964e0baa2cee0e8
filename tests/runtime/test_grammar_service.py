"""The compile service: non-blocking submit, de-duplication, memory and disk caches, and limits
that fail one request with a clear error while other compiles go on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
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
    assert handle.wait(60), "compile did not finish"
    return handle


def test_submit_returns_at_once_and_dedupes_in_flight(smollm_vocab: Any) -> None:
    faults = Faults(enabled=True)
    faults.arm("compile_hang")  # the first compile cannot finish before the 1 s limit
    limits = CompileLimits(timeout_s=1.0)
    with GrammarService(
        smollm_vocab, cache_dir=None, num_workers=1, limits=limits, faults=faults
    ) as svc:
        first = svc.submit(r"[0-9]{3}-[0-9]{4}")
        second = svc.submit(ConstraintSpec(regex=r"[0-9]{3}-[0-9]{4}"))
        assert first is second and not first.ready()  # returned while the compile runs
        assert "longer than the 1 s limit" in _ready(first).error
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


def test_bad_inputs_fail_their_own_handles_only(smollm_vocab: Any) -> None:
    """A compile past the time limit (the hang switch: one worker, so the first job takes
    it), bad patterns and refused keywords each fail their own handle only."""
    faults = Faults(enabled=True)
    faults.arm("compile_hang")
    limits = CompileLimits(timeout_s=1.0)
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
        assert "outlines-core cannot compile" in _ready(bad_regex).error
        assert "lookahead" in _ready(lookaround).error
        assert "#: minimum" in _ready(unsupported).error
        assert "longer than the 1 s limit" in _ready(huge).error
        assert faults.fired["compile_hang"] == 1
        with pytest.raises(ValueError, match="1 s limit"):
            huge.matcher()
        # The worker that was killed comes back for the next compile; failures are remembered.
        assert _ready(svc.submit("[a-z]{2}")).error is None
        again = svc.submit(HUGE)
        assert again.ready() and again.error == huge.error


def test_index_size_limit(smollm_vocab: Any) -> None:
    limits = CompileLimits(max_index_bytes=1 << 20)
    spec = ConstraintSpec.create(
        json_schema={"type": "object", "properties": {"a": {"type": "string", "maxLength": 20}}}
    )
    with GrammarService(smollm_vocab, cache_dir=None, limits=limits, num_workers=1) as svc:
        assert "over the limit of 1 MiB" in _ready(svc.submit(spec)).error
        assert "characters, over the limit" in _ready(svc.submit("a" * 300_000)).error


def test_memory_limit_kills_only_the_compile_worker(smollm_vocab: Any) -> None:
    limits = CompileLimits(max_memory_bytes=260 << 20)
    with GrammarService(smollm_vocab, cache_dir=None, limits=limits, num_workers=1) as svc:
        assert "memory limit" in _ready(svc.submit(HUGE)).error
        assert _ready(svc.submit("(yes|no)")).error is None


def test_non_strict_schema_surfaces_warnings(smollm_vocab: Any) -> None:
    spec = ConstraintSpec.create(json_schema={"type": "integer", "maximum": 9}, strict=False)
    with GrammarService(smollm_vocab, cache_dir=None, num_workers=1) as svc:
        handle = _ready(svc.submit(spec))
        assert handle.error is None
        assert handle.warnings == ["ignored: #: maximum"]
