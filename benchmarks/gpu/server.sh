#!/bin/bash
# The server on the GPU, from the repo root of the GPU machine: this tree against an older one,
# side by side (benchmarks/server_whole.py), 256 concurrent completions of 128 tokens, streamed
# and not, on Qwen2.5-Coder-1.5B's shape with random weights and the default model's 49152-token
# vocabulary (its tokenizer decodes the output).
# Carries: .gpucarry/tok (the tokenizer), .gpucarry/old (the older tree: `git archive OLD nextok
# benchmarks/host_step.py benchmarks/configs`, its commit in COMMIT) and .gpucarry/wheels (the
# server's packages, which the GPU image lacks: fastapi, uvicorn, ... for Python 3.12, from
# `pip download --only-binary :all: --python-version 3.12 ...`).
# SERVE_ARGS: more `nextok serve` flags for both. Everything written under $OUT comes back.
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/nextok-out}
mkdir -p "$OUT"
TOK=.gpucarry/smollm2-135m
step() { echo "=== $* ($(date -u +%T))"; }
. benchmarks/gpu/deadline.sh
[ -f .gpucarry/tok/smollm2-135m.tgz ] && tar -C .gpucarry -xzf .gpucarry/tok/smollm2-135m.tgz
python3 -m pip install -q --no-index --no-deps --target /tmp/py .gpucarry/wheels/*.whl 2>&1 | tail -2
step environment
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
  python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__)'
  echo "commit ${NEXTOK_COMMIT:-unknown}, old $(cat .gpucarry/old/COMMIT)"; } | tee "$OUT/env.txt"
for mode in ${MODES:-stream whole}; do
    step "256 completions x 128 tokens, $mode: A = old, B = this tree"
    flag=""; [ $mode = stream ] && flag=--stream
    run_for ${T_MODE:-240} python3 benchmarks/server_whole.py "$OUT/server-gpu-$mode.json" --a .gpucarry/old --b . \
        --path /tmp/py --config benchmarks/configs/qwen2.5-coder-1.5b --vocab 49152 --tokenizer $TOK \
        --serve-args "--dtype bfloat16 --kv-cache-memory-fraction 0.3 ${SERVE_ARGS:-}" --rounds ${ROUNDS:-3} $flag 2>&1 \
        | grep -v Warning | tail -12
done
