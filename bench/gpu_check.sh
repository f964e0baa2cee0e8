#!/usr/bin/env bash
# The GPU checks in one run, for a lent CUDA machine (CI never has one; nothing requires it):
#   1. the kernel tests and the engine-on-Triton tests, compiled (STEMMA_KERNEL_DEVICE=cuda);
#   2. the decode-attention kernel bench (bench/kernels_bench.py);
#   3. engine decode and fan-out on CUDA, Triton backend then torch backend, each beside HF
#      transformers on the same GPU, on SmolLM2-135M's shape with random weights (the GGUF
#      does not travel; speed does not depend on the weights' values).
# Usage (repo root): bash bench/gpu_check.sh OUT [WHEELS] [SHAPE]
#   OUT: folder for logs and JSON lines; WHEELS: folder of wheels the machine lacks;
#   SHAPE: folder holding a checkpoint's config.json, tokenizer.json, tokenizer_config.json.
set -uo pipefail
out=${1:?usage: gpu_check.sh OUT [WHEELS] [SHAPE]}
wheels=${2:-}
shape=${3:-}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [[ -n $wheels ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/stemma-site "$wheels"/*.whl || exit 1
    export PYTHONPATH=/tmp/stemma-site${PYTHONPATH:+:$PYTHONPATH}
fi
# The repo root is the package: put it on the path as `stemma`.
mkdir -p /tmp/stemma-pkg && ln -sfn "$PWD" /tmp/stemma-pkg/stemma
export PYTHONPATH=/tmp/stemma-pkg:$PYTHONPATH
unset TRITON_INTERPRET

{ nvidia-smi -L; python3 -c "import torch, triton, transformers; print('torch', torch.__version__,
'triton', triton.__version__, 'transformers', transformers.__version__)"; } 2>&1 | tee "$out/env.txt"

echo "== 1. kernel and engine tests on CUDA"
STEMMA_KERNEL_DEVICE=cuda timeout 300 python3 -m pytest tests/kernels -p no:cacheprovider \
    --junitxml="$out/kernel_tests.xml" 2>&1 | tee "$out/kernel_tests.log" | tail -40
tests_rc=${PIPESTATUS[0]}

echo "== 2. decode-attention kernel bench"
timeout 180 python3 -m stemma.bench.kernels_bench --out "$out/kernels.jsonl"
kernels_rc=$?

engine_rc=0
if [[ -n $shape ]]; then
    echo "== 3. engine on CUDA, random weights of $shape's shape"
    ckpt=/tmp/stemma-random-ckpt
    python3 - "$shape" "$ckpt" <<'EOF' || exit 1
import shutil, sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

shape, ckpt = Path(sys.argv[1]), Path(sys.argv[2])
torch.manual_seed(0)
config = AutoConfig.from_pretrained(shape)
model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
model.save_pretrained(ckpt)
for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(shape / name, ckpt / name)
print("random checkpoint at", ckpt, sum(p.numel() for p in model.parameters()), "parameters")
EOF
    results=bench/results/engine_bench.jsonl
    before=$(cat "$results" 2>/dev/null | wc -l)
    for backend in triton torch; do
        timeout 240 python3 -m stemma.bench.engine_bench --device cuda --model "$ckpt" \
            --dtype bfloat16 --workloads decode,fanout --batches 1,8,32,64 --repeats 3 \
            --attention-backend "$backend" || engine_rc=$?
    done
    tail -n +$((before + 1)) "$results" > "$out/engine_bench.jsonl"
fi
echo "rc: tests $tests_rc, kernels_bench $kernels_rc, engine_bench $engine_rc"
exit $((tests_rc || kernels_rc || engine_rc))
