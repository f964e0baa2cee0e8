"""The tree, pyproject's package list and the docs agree: every package ships, and every
path the README and docs/ARCHITECTURE.md name exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "docs" / "ARCHITECTURE.md"]
SHIPPED = ("lang", "radix", "runtime", "kernels", "examples", "bench")


def test_pyproject_lists_every_package() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()  # tomllib is 3.11+; the list is simple
    block = re.search(r"^packages = \[(.*?)\]", pyproject, re.S | re.M)
    assert block is not None
    listed = set(re.findall(r'"([\w.]+)"', block.group(1)))
    found = {"stemma"} | {
        ".".join(("stemma", *init.parent.relative_to(ROOT).parts))
        for top in SHIPPED
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert listed == found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_name_only_paths_that_exist(doc: Path) -> None:
    text = doc.read_text()
    paths = set(re.findall(r"\b(?:runtime|lang|radix|kernels|bench|tests)/[\w/]*\.py\b", text))
    assert paths and not {p for p in paths if not (ROOT / p).is_file()}


def test_readme_package_table_covers_every_runtime_package() -> None:
    text = (ROOT / "README.md").read_text()
    rows = set(re.findall(r"^\| `([\w/]+/)`", text, re.M))
    packages = {
        str(init.parent.relative_to(ROOT)) + "/" for init in (ROOT / "runtime").rglob("__init__.py")
    }
    assert packages <= rows
