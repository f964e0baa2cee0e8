"""Who may import whom (docs/ARCHITECTURE.md, "Layers"), checked by walking every module's
imports with ast. One table covers the top-level packages and runtime's layers:
server -> engine -> scheduler -> executor -> models, with sampling, constrained and the shared
leaves (config, dtype_policy, measured, tokenizer, weight_plan) beside them. Imports under
`if TYPE_CHECKING:` never run, so the layer table ignores them (a model may name the
executor's ForwardBatch as a type); the cycle check counts them too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STDLIB = set(sys.stdlib_module_names)
LANG_LAZY_OK = {"outlines_core", "pydantic", "tqdm"}  # lang may import these inside functions
HEAVY = ("torch", "numpy", "triton", "transformers")

# runtime's layers, highest first: each may import the layers after it, the side packages and
# the shared leaves, never one before it.
CHAIN = ["server", "engine", "scheduler", "executor", "models"]
SIDE = {"sampling": {"shared"}, "constrained": {"sampling", "shared"}, "shared": set()}
ENGINE_MODULES = {"engine", "engine_core", "engine_loop", "engine_state", "inbox", "inprocess"}
ENGINE_MODULES |= {"io_struct"}
ENGINE_MODULES |= {"limits", "outbox"}
# constraint: the public stemma.Constraint
ENGINE_MODULES |= {"response", "constraint", "cpu_caches"}
SHARED_MODULES = {"config", "dtype_policy", "faults", "measured", "tokenizer", "weight_plan"}
RUNTIME_MAY_IMPORT = ("stemma.radix", "stemma.kernels", "stemma.lang.backend")
RUNTIME_MAY_IMPORT += ("stemma.lang.constraints",)  # the one source of constraint constants
RUNTIME_MAY_IMPORT += ("stemma.lang.sampling_table",)  # the one table of sampling parameters


def may_import(layer: str) -> set[str]:
    if layer in SIDE:
        return {layer, *SIDE[layer]}
    return {*CHAIN[CHAIN.index(layer) :], *SIDE}


def module_name(path: Path) -> str:
    parts = ("stemma", *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def type_checking_nodes(tree: ast.Module) -> set[int]:
    """ids of every node inside an `if TYPE_CHECKING:` block."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return inside


def imports_of(path: Path) -> list[tuple[str, bool, bool]]:
    """(absolute module name, is_module_level, is_type_only) for every import in a file.

    `from pkg import name` yields pkg.name when that is a module, so edges name modules."""
    tree = ast.parse(path.read_text(), str(path))
    pkg = ".".join(("stemma", *path.relative_to(ROOT).parent.parts))
    top_level = {id(n) for n in tree.body}
    type_only = type_checking_nodes(tree)
    found = []
    for node in ast.walk(tree):
        flags = (id(node) in top_level, id(node) in type_only)
        if isinstance(node, ast.Import):
            found += [(a.name, *flags) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            subs = [f"{name}.{a.name}" for a in node.names if f"{name}.{a.name}" in MODULES]
            found += [(n, *flags) for n in subs or [name]]
    return found


def package_files(pkg: str) -> list[Path]:
    return sorted((ROOT / pkg).rglob("*.py"))


ALL_FILES = [
    p
    for pkg in ("", "lang", "radix", "runtime", "kernels")
    for p in (package_files(pkg) if pkg else [ROOT / "__init__.py", ROOT / "__main__.py"])
]
MODULES = {module_name(p): p for p in ALL_FILES}


def runtime_layer(module: str) -> str:
    """The layer of a stemma.runtime module (the package itself counts as shared)."""
    parts = module.split(".")[2:]
    if not parts or parts[0] in SHARED_MODULES:
        return "shared"
    if parts[0] in ENGINE_MODULES:
        return "engine"
    assert parts[0] in [*CHAIN, *SIDE], f"{module} is in no layer: add it to the table"
    return parts[0]


@pytest.mark.parametrize("path", package_files("radix"), ids=str)
def test_radix_imports_only_stdlib(path):
    for name, _, _ in imports_of(path):
        top = name.split(".")[0]
        assert top in STDLIB or name.startswith("stemma.radix"), f"{path.name} imports {name}"


def test_radix_is_whole_and_relative_imports_stay_inside_it():
    files = package_files("radix")
    assert len(files) >= 4
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        levels = [n.level for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert all(level <= 1 for level in levels), path.name


@pytest.mark.parametrize("path", package_files("kernels"), ids=str)
def test_kernels_import_only_torch_triton(path):
    for name, _, _ in imports_of(path):
        top = name.split(".")[0]
        ok = top in STDLIB or top in ("torch", "triton") or name.startswith("stemma.kernels")
        assert ok, f"{path.name} imports {name}"


@pytest.mark.parametrize("path", package_files("lang"), ids=str)
def test_lang_imports_stdlib_or_lazy_schema_tools(path):
    for name, module_level, _ in imports_of(path):
        top = name.split(".")[0]
        if name.startswith("stemma."):
            assert name.startswith("stemma.lang"), f"{path.name} imports {name}"
        elif top not in STDLIB:
            assert top in LANG_LAZY_OK and not module_level, f"{path.name} imports {name}"
            assert top not in HEAVY


def test_lang_is_whole():
    assert len(package_files("lang")) > 10


@pytest.mark.parametrize("path", package_files("runtime"), ids=str)
def test_runtime_layers(path):
    """A lower layer never imports a higher one; runtime reaches outside only for radix,
    kernels and lang's backend protocol, constraint constants and sampling table."""
    layer = runtime_layer(module_name(path))
    allowed = may_import(layer)
    for name, _, type_only in imports_of(path):
        if name.startswith("stemma.runtime"):
            target = runtime_layer(name)
            assert type_only or target in allowed, f"{layer} {path.name} imports {target} {name}"
        elif name.startswith("stemma"):
            assert name.startswith(RUNTIME_MAY_IMPORT), f"{path.name} imports {name}"


@pytest.mark.parametrize("pkg", ["radix", "runtime/constrained", "runtime/sampling", "lang"])
def test_nothing_below_the_server_imports_it(pkg):
    for path in package_files(pkg):
        for name, _, _ in imports_of(path):
            assert not name.startswith("stemma.runtime.server"), f"{path} imports {name}"


def test_no_import_cycles():
    """The module graph, type-only and function-level imports included, is acyclic."""
    graph = {
        mod: {n for n, _, _ in imports_of(path) if n in MODULES and n != mod}
        for mod, path in MODULES.items()
    }
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(mod: str, path: list[str]) -> None:
        state[mod] = 1
        for dep in sorted(graph[mod]):
            assert state.get(dep) != 1, "import cycle: " + " -> ".join([*path, mod, dep])
            if dep not in state:
                visit(dep, [*path, mod])
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [])


def test_import_stemma_and_lang_does_not_import_torch():
    code = (
        "import sys, stemma, stemma.lang, stemma.radix, stemma.examples.few_shot_classify\n"
        "heavy = [m for m in ('torch', 'numpy', 'triton', 'transformers', 'stemma.runtime')\n"
        "         if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")
