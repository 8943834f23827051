#!/bin/bash
# Issue 6 on the H200, from the repo root of the GPU machine (its own python3, torch, triton):
#   bash benchmarks/gpu/issue6.sh check        kernel tests, the real model, bench kernels, latency
#   bash benchmarks/gpu/issue6.sh throughput   1000 x 512 -> 256 on the dummy Llama-3.1-8B vs HF
# Inputs carried in .gpucarry/ (ignored by git): the default GGUF in two halves (gguf_a/part,
# gguf_b/part: one call carries at most 64 MiB) with its sha256, a tokenizer directory for the
# dummy checkpoints (the ids only need some tokenizer), and .whl/ with the gguf wheel that
# transformers needs to read the GGUF. Everything written under $OUT comes back.
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/nextok-out}
mkdir -p "$OUT"
TOK=.gpucarry/smollm2-135m
DUMMY="--load-format dummy --tokenizer $TOK --dtype bfloat16 --max-model-len 4096"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
step() { echo "=== $* ($(date -u +%T))"; }

case "${1:-}" in
check)
    step environment
    { nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
      python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)'
      git log -1 --format=%H 2>/dev/null; } | tee "$OUT/env.txt"
    step the real model: triton vs transformers, triton vs torch backend
    mkdir -p /tmp/model
    M=/tmp/model/SmolLM2-135M-Instruct.Q4_1.gguf
    cat .gpucarry/gguf_a/part .gpucarry/gguf_b/part > $M 2>/dev/null
    if [ "$(sha256sum $M | cut -c1-64)" = "$(cat .gpucarry/gguf.sha256)" ]; then
        timeout ${T_REAL:-100} python3 benchmarks/gpu/real_model_check.py $M "$OUT/real-model.json" 2>&1 | tail -12
    else
        echo "model halves missing or corrupt: skipped"
    fi
    step bench latency, Llama-3.1-8B shape, vs transformers
    timeout ${T_8B:-200} python3 -m nextok bench latency --model benchmarks/configs/llama-3.1-8b $DUMMY \
        --batch-sizes 1,8,32 --repeats 3 --baseline transformers --output "$OUT/latency-llama-8b.json" 2>&1 | tail -8
    step bench latency, Qwen2.5-Coder-1.5B shape, CUDA graphs vs eager
    timeout ${T_15B:-70} python3 -m nextok bench latency --model benchmarks/configs/qwen2.5-coder-1.5b $DUMMY \
        --batch-sizes 1,8 --repeats 3 --also-eager --output "$OUT/latency-qwen-1.5b.json" 2>&1 | tail -6
    step kernel tests on CUDA, realistic shapes
    timeout ${T_TESTS:-150} python3 -m pytest -q -p no:cacheprovider tests/kernels/test_triton_fused.py \
        tests/kernels/test_triton_attention.py 2>&1 | tail -8 | tee "$OUT/kernel-tests.txt"
    [ -n "${WITH_KERNEL_BENCH:-}" ] && timeout 150 python3 -m nextok bench kernels --output "$OUT/kernels.json" 2>&1 | tail -30
    ;;
throughput)
    step bench throughput, Llama-3.1-8B shape, 1000 x 512 -> 256, vs transformers
    python3 -m nextok bench throughput --model benchmarks/configs/llama-3.1-8b $DUMMY \
        --num-prompts 1000 --input-len 512 --output-len 256 --kv-cache-memory-fraction 0.35 \
        --baseline transformers --baseline-batch-sizes ${HF_BATCHES:-128,256} --baseline-prompts 4 \
        --output "$OUT/throughput-llama-8b.json" 2>&1 | grep -v "it/s\]" | tail -30
    ;;
*)
    echo "usage: $0 check|throughput" >&2
    exit 2
    ;;
esac
