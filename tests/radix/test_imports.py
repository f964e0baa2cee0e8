"""radix/ may import the standard library only (DESIGN.md: who may import whom)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import stemma.radix

RADIX_DIR = Path(stemma.radix.__file__).parent


def imported_modules(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.append(node.module or "")
    return names


def test_radix_imports_only_the_standard_library() -> None:
    files = sorted(RADIX_DIR.glob("*.py"))
    assert len(files) >= 4
    outside = {
        f"{path.name}: {name}"
        for path in files
        for name in imported_modules(path)
        if name.split(".")[0] not in sys.stdlib_module_names
    }
    assert outside == set()


def test_relative_imports_stay_inside_radix() -> None:
    for path in sorted(RADIX_DIR.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        levels = [n.level for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert all(level <= 1 for level in levels), path.name
