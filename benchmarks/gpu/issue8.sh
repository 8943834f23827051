#!/bin/bash
# Issue 8 (speculative decoding) on the H200, from the repo root of the GPU machine:
#   bash benchmarks/gpu/issue8.sh 8b      dummy Llama-3.1-8B, ngram vs off: concurrency 1 and the
#                                         throughput crossover over batch sizes; then (issue 7)
#                                         the KV capacity per cache dtype and, with ROUNDS=N,
#                                         N pairs of FP8 vs bf16 offline throughput
#   bash benchmarks/gpu/issue8.sh model   the default model in bf16: off vs ngram, self-draft and
#                                         medusa (heads trained there first by nextok train
#                                         medusa), on code / edit / random
# The default GGUF travels in two halves (a call carries <= 64 MiB, ~12 of it the tracked files):
# each call keeps the half it carries in /tmp/model (gguf_a with "8b" or any issue7.sh call,
# gguf_b with "model", on the same warm machine) and "model" joins them. Each
# call carries .gpucarry/tok/smollm2-135m.tgz, the tokenizer for the dummy checkpoints packed (the
# tracked files, half the GGUF and the plain tokenizer pass a call's 64 MiB):
# benchmarks/gpu/make_carry.sh.
# Everything written under $OUT comes back.
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/nextok-out}
mkdir -p "$OUT"
TOK=.gpucarry/smollm2-135m
L8B=benchmarks/configs/llama-3.1-8b
DUMMY="--load-format dummy --tokenizer $TOK --dtype bfloat16 --max-model-len 4096"
M=/tmp/model/SmolLM2-135M-Instruct.Q4_1.gguf
K=${K:-4}
step() { echo "=== $* ($(date -u +%T))"; }
step environment
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
  python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)'
  echo "commit ${NEXTOK_COMMIT:-unknown}"; } | tee "$OUT/env.txt"
[ -f .gpucarry/tok/smollm2-135m.tgz ] && tar -C .gpucarry -xzf .gpucarry/tok/smollm2-135m.tgz
mkdir -p /tmp/model
for p in a b; do [ -f .gpucarry/gguf_$p/part ] && cp .gpucarry/gguf_$p/part /tmp/model/part_$p; done
[ -f /tmp/model/part_b ] && cat /tmp/model/part_{a,b} > $M 2>/dev/null

spec() {  # $1: label, then bench spec flags
    local label=$1; shift
    timeout ${T_SPEC:-240} python3 -m nextok bench spec --num-speculative-tokens $K \
        --output "$OUT/spec-$label.json" "$@" 2>&1 | grep -v "Warning\|it/s\]" | tail -${TAIL:-16}
}

case "${1:-}" in
8b)
    step "8B dummy: ngram vs off, concurrency 1 and the crossover"
    TAIL=24 spec llama-8b-ngram --model $L8B $DUMMY --methods ngram --workloads code,random \
        --num-prompts 4 --output-len 128 --kv-cache-memory 24GiB \
        --crossover-batch-sizes ${SIZES:-1,4,16,32,64,128}
    step "KV capacity (issue 7): 4k-token sequences per cache dtype, one budget"
    for kind in auto int8 fp8; do
        timeout ${T_KV:-100} python3 benchmarks/gpu/kv_capacity.py $L8B $TOK "$OUT/kv-capacity-$kind.json" $kind \
            2>&1 | grep -v Warning | tail -1
    done
    for r in $(seq 1 ${ROUNDS:-0}); do
        for q in bf16 fp8; do
            step "throughput 1000 x 512 -> 256, 8B, $q (round $r)"
            extra=""; [ $q = fp8 ] && extra="--quantization fp8"
            timeout ${T_TP:-150} python3 -m nextok bench throughput --model $L8B $DUMMY --num-prompts 1000 \
                --input-len 512 --output-len 256 --kv-cache-memory-fraction 0.35 \
                --max-num-batched-tokens 8192 --max-num-seqs 256 $extra \
                --output "$OUT/throughput-llama-8b-$q-r$r.json" 2>&1 | grep -v "it/s\]" | tail -3
        done
    done
    ;;
model)
    [ "$(sha256sum $M 2>/dev/null | cut -c1-64)" = "$(cat .gpucarry/gguf.sha256)" ] \
        || { echo "model halves missing or corrupt"; exit 1; }
    # Medusa heads trained here first (the CPU-trained ones do not fit in the call's carry)
    step "Medusa heads trained on the GPU (${MEDUSA_STEPS:-1500} steps)"
    timeout ${T_TRAIN:-200} python3 -m nextok train medusa $M "$OUT/medusa-gpu" --data code \
        --steps ${MEDUSA_STEPS:-1500} --batch 16 --pool-windows ${POOL:-2048} --device cuda 2>&1 \
        | grep -v Warning | tail -8
    methods=${METHODS:-ngram@7,self-draft,medusa}
    heads="--medusa-heads $OUT/medusa-gpu"
    if [ ! -f "$OUT/medusa-gpu/medusa_heads.safetensors" ]; then  # training failed or ran out of time
        echo "no Medusa heads: medusa left out"; methods=${methods/,medusa/}; heads=""
    fi
    step "default model, bf16: off vs $methods"
    TAIL=30 spec smollm2-bf16 --model $M --dtype bfloat16 --methods $methods $heads \
        --workloads code,edit,random --held-out --num-prompts 8 \
        --output-len 128 --crossover-batch-sizes "${CROSS-1,16,64}"
    ;;
*)
    echo "usage: $0 8b|model" >&2
    exit 2
    ;;
esac
