"""DESIGN.md's import rules, checked by walking every module's imports with ast."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STDLIB = set(sys.stdlib_module_names)
LANG_LAZY_OK = {"outlines_core", "pydantic", "tqdm"}  # lang may import these inside functions


def imports_of(path: Path) -> list[tuple[str, bool]]:
    """(absolute module name, is_module_level) for every import in a file."""
    tree = ast.parse(path.read_text(), str(path))
    pkg = ".".join(("stemma", *path.relative_to(ROOT).parent.parts))
    top_level = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, id(node) in top_level) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((name, id(node) in top_level))
    return found


def package_files(pkg: str) -> list[Path]:
    return sorted((ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", package_files("radix"), ids=str)
def test_radix_imports_only_stdlib(path):
    for name, _ in imports_of(path):
        top = name.split(".")[0]
        assert top in STDLIB or name.startswith("stemma.radix"), f"{path.name} imports {name}"


@pytest.mark.parametrize("path", package_files("kernels"), ids=str)
def test_kernels_import_only_torch_triton(path):
    for name, _ in imports_of(path):
        top = name.split(".")[0]
        ok = top in STDLIB or top in ("torch", "triton") or name.startswith("stemma.kernels")
        assert ok, f"{path.name} imports {name}"


@pytest.mark.parametrize("path", package_files("lang"), ids=str)
def test_lang_imports_stdlib_or_lazy_schema_tools(path):
    for name, module_level in imports_of(path):
        top = name.split(".")[0]
        if name.startswith("stemma."):
            assert name.startswith("stemma.lang"), f"{path.name} imports {name}"
        elif top not in STDLIB:
            assert top in LANG_LAZY_OK and not module_level, f"{path.name} imports {name}"


def test_import_stemma_and_lang_does_not_import_torch():
    code = (
        "import sys, stemma, stemma.lang, stemma.radix\n"
        "heavy = [m for m in ('torch', 'numpy', 'triton', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")
