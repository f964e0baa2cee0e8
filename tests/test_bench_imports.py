"""Every bench module imports (its optional peers, such as xllamacpp or xgrammar, are imported
where they are used), so a re-layout cannot leave a bench pointing at a moved module."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCHES = sorted(p.stem for p in (Path(__file__).parent.parent / "bench").glob("*.py"))


@pytest.mark.parametrize("name", [b for b in BENCHES if b != "__init__"])
def test_bench_module_imports(name: str) -> None:
    module = importlib.import_module(f"stemma.bench.{name}")
    assert module.__doc__, f"bench/{name}.py opens without a docstring saying what it measures"
