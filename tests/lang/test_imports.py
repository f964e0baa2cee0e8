"""lang stays light: standard library only, never torch, numpy or the runtime packages."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

LANG_DIR = Path(__file__).resolve().parents[2] / "lang"
FORBIDDEN = ("torch", "numpy", "triton", "stemma.runtime", "stemma.kernels", "stemma.radix")
FORBIDDEN_RELATIVE = ("runtime", "kernels", "radix")


def _imports(path: Path) -> list[str]:
    """Every imported module name in `path`, relative ones as '..name' (dots kept)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append("." * node.level + (node.module or ""))
    return names


def _is_forbidden(name: str) -> bool:
    if name.startswith(".."):
        return name.lstrip(".").split(".")[0] in FORBIDDEN_RELATIVE
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


def test_lang_modules_import_nothing_forbidden():
    files = sorted(LANG_DIR.glob("*.py"))
    bad = {p.name: n for p in files for n in _imports(p) if _is_forbidden(n)}
    assert len(files) > 10
    assert bad == {}


def test_importing_stemma_does_not_import_torch():
    code = (
        "import sys, stemma, stemma.lang, stemma.examples.few_shot_classify\n"
        "heavy = sorted(m for m in ('torch', 'numpy', 'stemma.runtime') if m in sys.modules)\n"
        "print(','.join(heavy))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (result.returncode, result.stdout.strip()) == (0, ""), result.stderr


def test_public_names_are_exported_from_stemma():
    import stemma
    import stemma.lang

    for name in ("function", "gen", "select", "fork", "RuntimeEndpoint", "set_default_backend"):
        assert name in stemma.lang.__all__
        assert getattr(stemma, name) is getattr(stemma.lang, name)
