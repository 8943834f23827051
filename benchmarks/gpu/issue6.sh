#!/bin/bash
# Issue 6 on the H200, from the repo root of the GPU machine (its own python3, torch, triton):
#   bash benchmarks/gpu/issue6.sh check             the real model, latency (async on/off), profile
#   bash benchmarks/gpu/issue6.sh compile-baseline  8B batch 1 vs transformers' static cache + compile
#   bash benchmarks/gpu/issue6.sh throughput        1000 x 512 -> 256 on the dummy Llama-3.1-8B vs HF
#   bash benchmarks/gpu/issue6.sh fp32-check        bf16 greedy of nextok and HF against HF float32
#   bash benchmarks/gpu/issue6.sh kernels           kernel tests and table, latency, profile, GEMV probe
#   bash benchmarks/gpu/issue6.sh model             the real model checks and the float32 check
#   bash benchmarks/gpu/issue6.sh pdl               GEMV / PDL tests, the variants timed, 8B latency
# (kernels, model and compile-baseline: three back-to-back calls of one session. The first copies
# gguf_a to /tmp, the second carries gguf_b, so no call carries more than 64 MiB.)
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

join_model() {
    mkdir -p /tmp/model
    M=/tmp/model/SmolLM2-135M-Instruct.Q4_1.gguf
    [ -f .gpucarry/gguf_a/part ] && cp .gpucarry/gguf_a/part /tmp/model/part_a
    [ -f .gpucarry/gguf_b/part ] && cat /tmp/model/part_a .gpucarry/gguf_b/part > $M
    [ "$(sha256sum $M 2>/dev/null | cut -c1-64)" = "$(cat .gpucarry/gguf.sha256)" ]
}

environment() {
    step environment
    { nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
      python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)'
      echo "commit ${NEXTOK_COMMIT:-unknown}"; } | tee "$OUT/env.txt"
}

case "${1:-}" in
kernels)
    environment
    join_model || true  # only keeps gguf_a in /tmp for the next call
    step kernel tests on CUDA, realistic shapes
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_triton_fused.py \
        tests/kernels/test_triton_attention.py \
        tests/model/test_fused_decode_layers.py 2>&1 | tail -8 \
        | tee "$OUT/kernel-tests.txt"
    step bench kernels
    timeout 120 python3 -m nextok bench kernels --device cuda --dtype bfloat16 \
        --output "$OUT/kernels.json" 2>&1 | tail -30
    step bench latency, Llama-3.1-8B shape
    timeout ${T_8B:-150} python3 -m nextok bench latency --model benchmarks/configs/llama-3.1-8b $DUMMY \
        --batch-sizes 1,8,32 --repeats 3 --cuda-graph-max-batch 32 \
        --output "$OUT/latency-llama-8b.json" 2>&1 | tail -8
    step profile of decode steps, Llama-3.1-8B shape
    PROFILE_ASYNC_ONLY=1 timeout ${T_PROF:-100} python3 benchmarks/gpu/profile_step.py \
        benchmarks/configs/llama-3.1-8b $TOK "$OUT/profile-llama-8b.json" 1 8 2>&1 | grep -v Warning | tail -60
    step bench latency, Qwen2.5-Coder-1.5B shape, CUDA graphs vs eager
    timeout ${T_15B:-80} python3 -m nextok bench latency --model benchmarks/configs/qwen2.5-coder-1.5b $DUMMY \
        --batch-sizes 1,8 --repeats 3 --also-eager --cuda-graph-max-batch 32 \
        --output "$OUT/latency-qwen-1.5b.json" 2>&1 | tail -6
    if [ -n "${WITH_GEMV_PROBE:-}" ]; then
        step GEMV probe: Triton vs cuBLAS at decode shapes
        timeout ${T_GEMV:-100} python3 benchmarks/gpu/gemv_probe.py "$OUT/gemv-probe.json" 2>&1 | grep -v "^  " | tail -14
    fi
    ;;
pdl)
    environment
    join_model || true  # only keeps gguf_a in /tmp for the next call
    step GEMV and PDL kernel tests on CUDA, realistic shapes
    timeout ${T_TESTS:-150} python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_triton_gemv.py \
        tests/kernels/test_triton_fused.py tests/model/test_fused_decode_layers.py 2>&1 | tail -8 \
        | tee "$OUT/kernel-tests.txt"
    step decode step: cuBLAS vs Triton GEMV, with and without PDL, Llama-3.1-8B shape
    timeout ${T_PDL:-240} python3 benchmarks/gpu/pdl_probe.py benchmarks/configs/llama-3.1-8b $TOK \
        "$OUT/pdl-probe-llama-8b.json" 3 2>&1 | grep -v Warning | tail -40
    step bench latency, Llama-3.1-8B shape, defaults
    timeout ${T_8B:-150} python3 -m nextok bench latency --model benchmarks/configs/llama-3.1-8b $DUMMY \
        --batch-sizes 1,8,32 --repeats 3 --cuda-graph-max-batch 32 \
        --output "$OUT/latency-llama-8b.json" 2>&1 | tail -8
    ;;
model)
    step the real model: triton vs transformers, triton vs torch backend, async vs sync
    if join_model; then
        timeout ${T_REAL:-200} python3 benchmarks/gpu/real_model_check.py $M "$OUT/real-model.json" 2>&1 \
            | grep -v '^ *\[\|^ *[0-9.,-]*$' | tail -30
        step bf16 greedy vs float32, transformers and nextok, the real model
        timeout ${T_FP32:-150} python3 benchmarks/gpu/fp32_reference_check.py $M \
            "$OUT/fp32-reference.json" 2>&1 | grep -v Warning | tail -20
    else
        echo "model halves missing or corrupt: skipped"
    fi
    ;;
check)
    step environment
    { nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
      python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)'
      git log -1 --format=%H 2>/dev/null; } | tee "$OUT/env.txt"
    step the real model: triton vs transformers, triton vs torch backend, async vs sync
    mkdir -p /tmp/model
    M=/tmp/model/SmolLM2-135M-Instruct.Q4_1.gguf
    [ -f $M ] || cat .gpucarry/gguf_a/part .gpucarry/gguf_b/part > $M 2>/dev/null
    if [ "$(sha256sum $M | cut -c1-64)" = "$(cat .gpucarry/gguf.sha256)" ]; then
        timeout ${T_REAL:-200} python3 benchmarks/gpu/real_model_check.py $M "$OUT/real-model.json" 2>&1 \
            | grep -v '^ *\[\|^ *[0-9.,-]*$' | tail -40
    else
        echo "model halves missing or corrupt: skipped"
    fi
    step bench latency, Llama-3.1-8B shape, async scheduling on and off
    timeout ${T_8B:-150} python3 -m nextok bench latency --model benchmarks/configs/llama-3.1-8b $DUMMY \
        --batch-sizes 1,8,32 --repeats 3 --also-sync --cuda-graph-max-batch 32 \
        --output "$OUT/latency-llama-8b.json" 2>&1 | tail -8
    step profile of decode steps, Llama-3.1-8B shape
    timeout ${T_PROF:-120} python3 benchmarks/gpu/profile_step.py benchmarks/configs/llama-3.1-8b $TOK \
        "$OUT/profile-llama-8b.json" 1 32 2>&1 | grep -v Warning | tail -40
    step bench latency, Qwen2.5-Coder-1.5B shape, CUDA graphs vs eager
    timeout ${T_15B:-80} python3 -m nextok bench latency --model benchmarks/configs/qwen2.5-coder-1.5b $DUMMY \
        --batch-sizes 1,8 --repeats 3 --also-eager --cuda-graph-max-batch 32 \
        --output "$OUT/latency-qwen-1.5b.json" 2>&1 | tail -6
    if [ -n "${WITH_KERNEL_TESTS:-}" ]; then
        step kernel tests on CUDA, realistic shapes
        timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_triton_fused.py \
            tests/kernels/test_triton_attention.py 2>&1 | tail -8 | tee "$OUT/kernel-tests.txt"
    fi
    ;;
compile-baseline)
    join_model || true  # keeps gguf_a in /tmp when carried, for a "model" call next
    step bench latency batch 1, Llama-3.1-8B shape, vs transformers eager and static+compile
    timeout ${T_HF:-540} python3 -m nextok bench latency --model benchmarks/configs/llama-3.1-8b $DUMMY \
        --batch-sizes 1,8,32 --repeats 3 --cuda-graph-max-batch 32 --baseline transformers \
        --output "$OUT/latency-llama-8b-vs-hf.json" 2>&1 | grep -v Warning | tail -12
    ;;
throughput)
    step bench throughput, Llama-3.1-8B shape, 1000 x 512 -> 256, vs transformers
    timeout ${T_TP:-560} python3 -m nextok bench throughput --model benchmarks/configs/llama-3.1-8b $DUMMY \
        --num-prompts 1000 --input-len 512 --output-len 256 --kv-cache-memory-fraction ${KV_FRAC:-0.35} \
        --max-num-batched-tokens 8192 --max-num-seqs ${MAX_SEQS:-256} \
        --baseline transformers --baseline-batch-sizes ${HF_BATCHES:-128,256} --baseline-prompts 1 \
        --baseline-padded-prompts 256 \
        --output "$OUT/throughput-llama-8b.json" 2>&1 | grep -v "it/s\]" | tail -30
    ;;
fp32-check)
    step bf16 greedy vs float32, transformers and nextok, the real model
    timeout ${T_FP32:-150} python3 benchmarks/gpu/fp32_reference_check.py /tmp/model/SmolLM2-135M-Instruct.Q4_1.gguf \
        "$OUT/fp32-reference.json" 2>&1 | grep -v Warning | tail -20
    ;;
*)
    echo "usage: $0 check|compile-baseline|throughput|fp32-check" >&2
    exit 2
    ;;
esac
