"""The kernels compile for a GPU (sm_90, Hopper) on this machine without one: Triton's compiler,
not the interpreter the other kernel tests use, with the ptxas in Triton's wheel. The
interpreter accepts code the compiler refuses; this is where CI sees it. Each check runs in a
fresh process without TRITON_INTERPRET, which conftest set for this one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path


def run_python(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton's default, named so it does not warn
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=600
    )


def test_every_kernel_compiles_for_sm90():
    done = run_python(["-m", "stemma.kernels.aot", "--arch", "90", "--quick"])
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    kernels = ("_decode_split_kernel", "_decode_reduce_kernel", "_extend_kernel")
    for name in (*kernels, "_apply_token_bitmask_kernel"):
        assert any(ln.startswith("sm_90 ok") and f" {name}(" in ln for ln in lines), done.stdout
    last = lines[-1]
    compiled, _, total = last.partition(" compiled")[0].partition(" of ")
    assert compiled == total and int(total) >= 10, last


def test_a_kernel_only_the_interpreter_accepts_fails(tmp_path):
    # A plain float global inside a jit function: the interpreter runs it, the compiler refuses.
    (tmp_path / "bad_kernel.py").write_text(
        textwrap.dedent(
            """
            import torch
            import triton
            import triton.language as tl

            from stemma.kernels import aot

            SCALE = 2.0


            @triton.jit
            def scale_kernel(x_ptr, n, BLOCK: tl.constexpr):
                offs = tl.arange(0, BLOCK)
                x = tl.load(x_ptr + offs, mask=offs < n)
                tl.store(x_ptr + offs, x * SCALE, mask=offs < n)


            def launch():
                scale_kernel[(1,)](torch.zeros(8), 8, BLOCK=8)


            [(arch, name, error, _)] = aot.compile_all([90], launch)
            print(name, "|", error)
            """
        )
    )
    done = run_python(["bad_kernel.py"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "scale_kernel(BLOCK=8; *fp32) | CompilationError" in done.stdout, done.stdout
    assert "SCALE" in done.stdout
