"""Peak memory of converting a GGUF into safetensors (models/gguf_convert.py), in a fresh process.

  python -m stemma.bench.convert_bench [--model smollm2-135m | path.gguf]

Reports the process's peak RSS before and after the conversion beside the largest tensor
dequantized to float32 and the whole float32 output: a streaming conversion peaks near
baseline + largest tensor (+ the GGUF pages mapped while reading), not baseline + output.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from .common import append_results, print_table

CHILD = """
import json, resource, sys, tempfile, time
from pathlib import Path
import gguf, numpy as np, transformers
from stemma.runtime.models.gguf_convert import convert_gguf
path = Path(sys.argv[1])
reader = gguf.GGUFReader(str(path))
sizes = [4 * int(np.prod([int(d) for d in t.shape])) for t in reader.tensors]
del reader
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t0 = time.perf_counter()
with tempfile.TemporaryDirectory() as out:
    convert_gguf(path, Path(out))
    seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"gguf_mb": path.stat().st_size / 2**20, "rss_before_mb": before,
                  "peak_rss_mb": peak, "largest_tensor_f32_mb": max(sizes) / 2**20,
                  "output_f32_mb": sum(sizes) / 2**20, "convert_s": seconds}))
"""


def gguf_path(model: str) -> str:
    if model.endswith(".gguf"):
        return model
    import importlib.util
    from pathlib import Path

    from ..runtime.models.loader import BUILTIN_MODELS

    package, filename = BUILTIN_MODELS[model]
    spec = importlib.util.find_spec(package)
    return str(Path(spec.submodule_search_locations[0]) / filename)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    args = ap.parse_args(argv)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, gguf_path(args.model)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    rows = [
        {"workload": f"convert {args.model} (streaming)", "metric": k, "value": round(v, 2)}
        for k, v in result.items()
    ]
    append_results("convert_bench", rows)
    print_table(rows, ["workload", "metric", "value"])


if __name__ == "__main__":
    main()
