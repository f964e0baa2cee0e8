"""bench/common.py is the one writer of benchmark results: every line it appends carries the
same stamp (commit, command, the CPU's model name and ISA), and no other bench module opens a
file to append to."""

from __future__ import annotations

import ast
import json
import platform
from pathlib import Path

import pytest
from stemma.bench.common import ISA_FLAGS, append_results

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_every_line_is_stamped_with_the_cpu_model_and_isa(tmp_path: Path) -> None:
    rows = [{"metric": "a", "value": 1.0}, {"metric": "b", "value": 2.0}]
    path = append_results("x", rows, path=tmp_path / "x.jsonl", command="cmd", peer="v1")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["metric"] for line in lines] == ["a", "b"]
    for line in lines:
        assert line["command"] == "cmd" and line["peer"] == "v1" and line["commit"]
        hardware = line["hardware"]
        assert hardware["cpu"] not in ("", platform.machine())  # a model name, not "x86_64"
        assert hardware["arch"] == platform.machine()
        assert set(hardware["isa"]) <= {label for label, _ in ISA_FLAGS}


def appends(node: ast.AST) -> bool:
    """Whether `node` is a call open(..., "a") or path.open("a") (with mode= too)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if not (isinstance(func, ast.Name | ast.Attribute) and ast.unparse(func).endswith("open")):
        return False
    modes = [*node.args, *(k.value for k in node.keywords if k.arg == "mode")]
    return any(isinstance(m, ast.Constant) and m.value in ("a", "ab", "a+") for m in modes)


@pytest.mark.parametrize("path", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_no_other_bench_module_appends_results(path: Path) -> None:
    found = [n.lineno for n in ast.walk(ast.parse(path.read_text())) if appends(n)]
    assert (found != []) == (path.name == "common.py"), f"{path.name} appends at lines {found}"
