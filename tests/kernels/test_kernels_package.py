"""The kernels package: its lazy exports are the functions, and it imports only torch, triton,
the standard library and itself."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import stemma.kernels as kernels

KERNELS_DIR = Path(kernels.__file__).parent


def test_exports_resolve_to_functions():
    for name in kernels.__all__:
        assert callable(getattr(kernels, name)), name
    # Importing the submodules must not shadow an exported function with a module.
    import stemma.kernels.decode_attn  # noqa: F401
    import stemma.kernels.extend_attn  # noqa: F401

    assert kernels.decode_attention.__name__ == "decode_attention"
    assert kernels.extend_attention.__name__ == "extend_attention"


def test_imports_only_torch_triton_and_stdlib():
    allowed = {"torch", "triton"} | set(sys.stdlib_module_names)
    for path in sorted(KERNELS_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = {(node.module or "").split(".")[0]}
            else:
                continue
            assert roots <= allowed, f"{path.name} imports {roots - allowed}"
