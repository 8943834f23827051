#!/bin/bash
# Issue 7 (quantization) on the H200, from the repo root of the GPU machine:
#   bash benchmarks/gpu/issue7.sh w4a16     kernel tests on CUDA (TEST_K: pytest -k); the W4A16 tile sweep; the 8B
#                                           decode step bf16 vs int4 (W4A16), A/B interleaved;
#                                           PROFILE=1: first a profile of int4 steps by kernel;
#                                           GM=1: int4 with d, m in group order at groups of 128 too
#   bash benchmarks/gpu/issue7.sh gguf      the Triton GGUF block kernel and the W4A16 / W8A16 layers GGUF
#                                           types become: their tests on CUDA (GGUF_TESTS), then its tiles
#                                           at the 8B layer shapes per type against bf16 (gguf_probe.py;
#                                           GGUF_SHAPES, GGUF_TYPES, and its own PROBE_GGUF_ROWS, PROBE_BN/NW/NS)
#   bash benchmarks/gpu/issue7.sh tests     CUDA tests of the attention kernels, the Triton engine and its
#                                           start-up warm-up (TESTS: other files)
#   bash benchmarks/gpu/issue7.sh lat256    the batch-256 step (512 in, 64 out, 8192-token chunks) per
#                                           LAT_RUNS variant (bf16 fp8 fp8kv): prefill and decode step
#   bash benchmarks/gpu/issue7.sh decode    the paged decode kernel's tiles per KV cache dtype (decode_probe.py)
#   bash benchmarks/gpu/issue7.sh kernels   nextok bench kernels: the fused ops, paged decode on bf16 / int8 /
#                                           fp8 caches (batch 32 x 4096, 256 x 576) and prefill
#   bash benchmarks/gpu/issue7.sh rows      W4A16 at 16-64 rows: the CUDA tests of the tl.dot kernel, its tiles
#                                           against dequantize + cuBLAS and bf16 (w4a16_dot_probe.py), and
#                                           the 8B step at batch 16/32/64: bf16, int4 as committed, int4
#                                           with the kernel up to 64 rows (NEXTOK_W4A16_ROWS) on the probe's tiles
#   bash benchmarks/gpu/issue7.sh big       W4A16 at 65-256 rows (past KERNEL_ROWS): CUDA tests at 100 and 256 rows,
#                                           the tl.dot probe at 128 and 256 rows, and the 8B step at batch
#                                           128/256: bf16 and int4 with the kernel up to 256 rows on the
#                                           probe's tiles, A B A B, then int4 as committed (dequantize + cuBLAS)
#   bash benchmarks/gpu/issue7.sh w8        W8A16 (--quantization int8): its CUDA tests, its tiles at 1/16/64/256 rows
#                                           (w8a16_probe.py), and the 8B step at batch W8_BATCHES: bf16, int8
#                                           with the kernel up to 256 rows on the probe's tiles, A B A B
#   bash benchmarks/gpu/issue7.sh plan      all of the above that item 4 still needs, in order, under DEADLINE
#   bash benchmarks/gpu/issue7.sh fp8-kv    offline throughput 1000 x 512 -> 256, bf16 vs fp8 (and fp8
#                                           with an fp8 KV cache); the
#                                           4k-token sequences a KV budget holds per cache dtype
# Reads .gpucarry/smollm2-135m or .gpucarry/tok/smollm2-135m.tgz (a tokenizer for the dummy
# checkpoints: benchmarks/gpu/make_carry.sh).
# Everything written under $OUT comes back.
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/nextok-out}
mkdir -p "$OUT"
TOK=.gpucarry/smollm2-135m
L8B=benchmarks/configs/llama-3.1-8b
DUMMY="--load-format dummy --tokenizer $TOK --dtype bfloat16 --max-model-len 4096"
step() { echo "=== $* ($(date -u +%T))"; }
. benchmarks/gpu/deadline.sh  # run_for CAP CMD...: CMD under the call's deadline (DEADLINE=S)
[ -f .gpucarry/tok/smollm2-135m.tgz ] && tar -C .gpucarry -xzf .gpucarry/tok/smollm2-135m.tgz
mkdir -p /tmp/model  # a part of the default GGUF carried for issue8.sh model (see there)
for p in a b; do [ -f .gpucarry/gguf_$p/part ] && cp .gpucarry/gguf_$p/part /tmp/model/part_$p; done
step environment
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
  python3 -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)'
  echo "commit ${NEXTOK_COMMIT:-unknown}"; } | tee "$OUT/env.txt"

latency() {  # $1: label, then extra flags
    local label=$1; shift
    run_for ${T_LAT:-150} python3 -m nextok bench latency --model $L8B $DUMMY --batch-sizes 1,8 \
        --repeats 2 --cuda-graph-max-batch ${GRAPH_MAX:-32} "$@" --output "$OUT/latency-llama-8b-$label.json" 2>&1 \
        | grep -v Warning | tail -4
}

lat_at() {  # $1: batch sizes, $2: largest graph batch, $3: label, then extra flags; one round
    local batches=$1 graphs=$2 label=$3; shift 3
    run_for ${T_LAT:-100} python3 -m nextok bench latency --model $L8B $DUMMY --batch-sizes $batches \
        --repeats 1 --cuda-graph-max-batch $graphs "$@" --output "$OUT/latency-llama-8b-$label.json" 2>&1 \
        | grep -v Warning | tail -7
}

case "${1:-}" in
w4a16)
    if [ -z "${SKIP_TESTS:-}" ]; then
        step kernel tests on CUDA: W4A16, W8A16, FP8, int4
        run_for ${T_TESTS:-200} python3 -m pytest -q -p no:cacheprovider tests/kernels/test_triton_quant_linear.py \
            tests/quant/test_fp8.py tests/quant/test_int4.py ${TEST_K:+-k "$TEST_K"} 2>&1 | tail -12 | tee "$OUT/kernel-tests.txt"
    fi
    if [ -z "${SKIP_PROBE:-}" ]; then  # else the committed table (kernels/triton/configs)
        step W4A16 dp4a tile sweep, Llama-3.1-8B layer shapes
        run_for ${T_PROBE:-240} python3 benchmarks/gpu/w4a16_probe.py "$OUT/w4a16-probe.json" "$OUT/w4a16-table.json" \
            ${PROBE_SHAPES:-6144x4096,4096x4096,28672x4096,4096x14336} 2>&1 | grep -v "^  " | tail -12
        # (a sweep cut short keeps the shapes it finished, the committed tiles for the rest)
        [ -f "$OUT/w4a16-table.json" ] && export NEXTOK_W4A16_CONFIGS=$OUT/w4a16-table.json
    fi
    if [ -n "${PROFILE:-}" ]; then  # where an int4 step's time goes, kernel by kind
        step "profile of int4 decode steps, 8B, batch 1"
        PROFILE_QUANT=int4 PROFILE_ASYNC_ONLY=1 run_for ${T_PROF:-100} python3 benchmarks/gpu/profile_step.py \
            $L8B $TOK "$OUT/profile-llama-8b-int4.json" 1 2>&1 | grep -v Warning | tail -40
    fi
    for r in $(seq 1 ${ROUNDS:-2}); do
        [ -z "${SKIP_BF16:-}" ] && { step "8B decode step, bf16 (round $r)"; latency bf16-r$r; }
        if [ -z "${SKIP_INT4:-}" ]; then  # SKIP_INT4=1 (with LM_HEAD=1): only the int4 lm_head's step
            step "8B decode step, int4 W4A16 (round $r)"; latency int4-r$r --quantization int4
        fi
        if [ -n "${GM:-}" ]; then  # d and m in group order at groups of 128 too
            step "8B decode step, int4 W4A16, d and m in group order (round $r)"
            NEXTOK_INT4_GROUP_MAJOR_MAX=128 latency int4-group-major-r$r --quantization int4
        fi
        if [ -n "${LM_HEAD:-}" ]; then
            step "8B decode step, int4 W4A16 with an int4 lm_head (round $r)"
            latency int4-lm-head-r$r --quantization int4 --quantize-lm-head
        fi
    done
    ;;
gguf)
    step GGUF tests on CUDA: the block kernel, the W4A16 and W8A16 conversions, W8A16 group scales
    run_for ${T_TESTS:-200} python3 -m pytest -q -p no:cacheprovider --tb=short ${GGUF_TESTS:-tests/kernels/test_triton_gguf_linear.py \
        tests/quant/test_gguf_int4.py tests/quant/test_gguf_int8.py tests/kernels/test_triton_quant_linear.py -k "gguf or w8a16_groups"} \
        2>&1 | tail -12 | tee "$OUT/gguf-kernel-tests.txt"
    step GGUF kernel tiles, Llama-3.1-8B layer shapes
    run_for ${T_PROBE:-300} python3 benchmarks/gpu/gguf_probe.py "$OUT/gguf-probe.json" \
        ${GGUF_SHAPES:-6144x4096,4096x4096,28672x4096,4096x14336} ${GGUF_TYPES:-2,12,6,14,8} 2>&1 | grep -v "^  " | tail -45
    ;;
tests)
    step "CUDA tests: ${TESTS:=tests/kernels/test_triton_attention.py tests/e2e/test_triton_engine.py tests/e2e/test_warmup_kernels.py}"
    # the e2e tests' random-weight models take the carried tokenizer (the GGUF does not travel)
    NEXTOK_TEST_TOKENIZER=$PWD/$TOK run_for ${T_TESTS:-200} python3 -m pytest -q -p no:cacheprovider \
        --tb=short -rfE $TESTS > "$OUT/cuda-tests.txt" 2>&1
    grep -E "^(E |FAILED|ERROR|[0-9]+ (passed|failed))|Error" "$OUT/cuda-tests.txt" | tail -40
    ;;
lat256)
    for q in ${LAT_RUNS:-bf16 fp8 fp8kv}; do
        extra=""
        [ $q = fp8 ] && extra="--quantization fp8"
        [ $q = fp8kv ] && extra="--quantization fp8 --kv-cache-dtype fp8"
        step "batch-256 step, 8B, $q"
        run_for ${T_LAT:-100} python3 -m nextok bench latency --model $L8B $DUMMY --batch-sizes 256 \
            --input-len 512 --output-len 64 --repeats 1 --max-num-batched-tokens 8192 \
            --kv-cache-memory-fraction ${KV_FRAC:-0.35} $extra --output "$OUT/latency-b256-$q.json" 2>&1 \
            | grep -v Warning | tail -3
    done
    ;;
decode)
    step "paged decode tiles per KV cache dtype (DECODE_KINDS)"
    run_for ${T_DECODE:-150} python3 benchmarks/gpu/decode_probe.py "$OUT/decode-probe.json" \
        ${DECODE_KINDS:-auto,int8,fp8} 2>&1 | grep -v Warning | grep -E "^best|Error" 
    ;;
kernels)
    step "bench kernels (fused ops, paged attention per KV cache dtype)"
    run_for ${T_KERNELS:-150} python3 -m nextok bench kernels --output "$OUT/kernels.json" 2>&1 \
        | grep -v Warning | tail -30
    ;;
fp8-kv)
    # fp8kv: FP8 weights and an fp8 KV cache, as FP8 is served on Hopper. In this workload the
    # decode steps read more KV (256 sequences x ~640 tokens x 128 KiB) than weights (16 GB), so
    # FP8 weights alone speed a step up by ~1.3x at most.
    i=0  # runs numbered in order, so that A B A B keeps every result
    for q in ${TP_RUNS:-bf16 fp8 fp8kv}; do
        i=$((i + 1))
        step "throughput 1000 x 512 -> 256, 8B, $q (run $i)"
        extra=""
        [ $q = fp8 ] && extra="--quantization fp8"
        [ $q = fp8kv ] && extra="--quantization fp8 --kv-cache-dtype fp8"
        run_for ${T_TP:-200} python3 -m nextok bench throughput --model $L8B $DUMMY --num-prompts 1000 \
            --input-len 512 --output-len 256 --kv-cache-memory-fraction ${KV_FRAC:-0.35} \
            --max-num-batched-tokens 8192 --max-num-seqs ${MAX_SEQS:-256} $extra \
            --output "$OUT/throughput-llama-8b-$q-$i.json" 2>&1 | grep -v "it/s\]" | tail -6
    done
    step KV capacity: 4k-token sequences per cache dtype, one budget
    for kind in ${KV_KINDS-auto int8 fp8}; do
        run_for ${T_KV:-100} python3 benchmarks/gpu/kv_capacity.py $L8B $TOK "$OUT/kv-capacity-$kind.json" $kind \
            2>&1 | grep -v Warning | tail -2
    done
    ;;
rows)
    # W4A16 at 8-64 rows: the CUDA tests of the tl.dot tile options (PAIRS's PTX) and row
    # classes; the 8B step at batch 8/16/32/64 as bf16, int4 on the committed tiles (the kernel
    # up to w4a16_tiles.KERNEL_ROWS); the tl.dot probe (at 8 rows: dp4a or tl.dot); int4 on the
    # probe's tiles; bf16 again.
    # ROWS_PROBE=0: no probe, the committed int4 again instead. ROW_BATCHES: the batch sizes.
    step "CUDA tests: W4A16 at 16-64 rows"
    run_for ${T_TESTS:-90} python3 -m pytest -q -p no:cacheprovider tests/kernels/test_triton_quant_linear.py \
        -k "tile_options or row_classes" > "$OUT/rows-tests.txt" 2>&1
    grep -E "^E  .*(Mismatch|Greatest)|^(FAILED|ERROR)|passed|failed" "$OUT/rows-tests.txt" | tail -12
    # an int4 engine compiles nothing after its warm-up (steps of 1-64 tokens)
    NEXTOK_TEST_TOKENIZER=$PWD/$TOK run_for ${T_WARM:-60} python3 -m pytest -q -p no:cacheprovider \
        tests/e2e/test_warmup_kernels.py -k "int4" > "$OUT/rows-warmup-test.txt" 2>&1
    grep -E "^E  |^(FAILED|ERROR)|passed|failed" "$OUT/rows-warmup-test.txt" | tail -6
    rlat() { local label=$1; shift; lat_at ${ROW_BATCHES:-8,16,32,64} 64 rows-$label "$@"; }
    step "8B decode step at batch ${ROW_BATCHES:-8,16,32,64}, bf16"; rlat bf16-1
    step "8B decode step, int4, committed tiles"; rlat int4-committed-1 --quantization int4
    if [ "${ROWS_PROBE:-1}" != 0 ]; then
        step "W4A16 tl.dot tiles at 8-64 rows, Llama-3.1-8B layer shapes"
        run_for ${T_PROBE:-150} python3 benchmarks/gpu/w4a16_dot_probe.py "$OUT/w4a16-dot-probe.json" \
            "$OUT/w4a16-dot-table.json" 2>&1 | grep -v "^  " | tail -18
        if [ -f "$OUT/w4a16-dot-table.json" ]; then
            step "8B decode step, int4, the probe's tiles"
            NEXTOK_W4A16_CONFIGS=$OUT/w4a16-dot-table.json rlat int4-probe --quantization int4
        fi
    fi
    step "8B decode step, bf16 again"; rlat bf16-2
    if [ "${ROWS_PROBE:-1}" = 0 ]; then  # without the probe: the pair again, A B A B
        step "8B decode step, int4, committed tiles again"; rlat int4-committed-2 --quantization int4
    fi
    ;;
big)
    # W4A16 at 65-256 rows, which past KERNEL_ROWS (64) dequantize the whole weight and run cuBLAS:
    # the tl.dot kernel over 2-4 blocks of rows instead (NEXTOK_W4A16_ROWS=256) on the probe's
    # tiles. Whether KERNEL_ROWS should move is read off the step times.
    if [ "${BIG_TESTS:-1}" != 0 ]; then  # (BIG_TESTS=0: the probe's check of each tile only)
        step "CUDA tests: W4A16 at 100 and 256 rows, row classes"
        run_for ${T_TESTS:-90} python3 -m pytest -q -p no:cacheprovider tests/kernels/test_triton_quant_linear.py \
            -k "(test_w4a16 and (100 or 256)) or row_classes or rows_limit" > "$OUT/big-tests.txt" 2>&1
        grep -E "^E  .*(Mismatch|Greatest)|^(FAILED|ERROR)|passed|failed" "$OUT/big-tests.txt" | tail -12
    fi
    step "W4A16 tl.dot tiles at 128 and 256 rows, Llama-3.1-8B layer shapes"
    PROBE_ROWS=128,256 run_for ${T_PROBE:-120} python3 benchmarks/gpu/w4a16_dot_probe.py "$OUT/w4a16-big-probe.json" \
        "$OUT/w4a16-big-table.json" 2>&1 | grep -v "^  " | tail -10
    blat() { local label=$1; shift; lat_at ${BIG_BATCHES:-128,256} 256 big-$label "$@"; }
    kernel() {  # int4 with the kernel up to 256 rows, on the probe's table (else the committed one)
        NEXTOK_W4A16_ROWS=256 NEXTOK_W4A16_CONFIGS=$( [ -f "$OUT/w4a16-big-table.json" ] && echo "$OUT/w4a16-big-table.json") \
            blat "$@" --quantization int4
    }
    step "8B decode step at batch ${BIG_BATCHES:-128,256}, bf16"; blat bf16-1
    step "8B decode step, int4, the kernel up to 256 rows"; kernel int4-kernel-1
    step "8B decode step, bf16 again"; blat bf16-2
    step "8B decode step, int4, the kernel up to 256 rows, again"; kernel int4-kernel-2
    step "8B decode step, int4 as committed (dequantize + cuBLAS past 64 rows)"; blat int4-committed --quantization int4
    ;;
w8)
    # W8A16: the kernel on tiled K with split sums and tl.dot past one row, up to 256 rows
    # (NEXTOK_W8A16_ROWS) on the probe's tiles, against bf16. KERNEL_ROWS is read off the steps.
    step "CUDA tests: W8A16"
    run_for ${T_TESTS:-90} python3 -m pytest -q -p no:cacheprovider tests/kernels/test_triton_quant_linear.py \
        -k "w8a16" > "$OUT/w8-tests.txt" 2>&1
    grep -E "^E  .*(Mismatch|Greatest)|^(FAILED|ERROR)|passed|failed" "$OUT/w8-tests.txt" | tail -12
    step "W8A16 tiles at ${PROBE_ROWS:-1,16,64,256} rows, Llama-3.1-8B layer shapes"
    run_for ${T_PROBE:-150} python3 benchmarks/gpu/w8a16_probe.py "$OUT/w8a16-probe.json" "$OUT/w8a16-table.json" \
        2>&1 | grep -v "^  " | tail -22
    wlat() { local label=$1; shift; lat_at ${W8_BATCHES:-1,16,64,256} 256 w8-$label "$@"; }
    int8() {
        NEXTOK_W8A16_ROWS=256 NEXTOK_W8A16_CONFIGS=$( [ -f "$OUT/w8a16-table.json" ] && echo "$OUT/w8a16-table.json") \
            wlat "$@" --quantization int8
    }
    step "8B decode step at batch ${W8_BATCHES:-1,16,64,256}, bf16"; wlat bf16-1
    step "8B decode step, int8, the kernel up to 256 rows"; int8 int8-kernel-1
    step "8B decode step, bf16 again"; wlat bf16-2
    step "8B decode step, int8, the kernel up to 256 rows, again"; int8 int8-kernel-2
    ;;
plan)
    # What item 4 still needs, most needed first, under one call's deadline (DEADLINE=S; a step
    # that would not finish is skipped). On an H200: the FP8 throughput pair (bf16, FP8 weights
    # with an fp8 KV cache: last timed there before the fp8 decode tile's int32 words); the
    # one-row W4A16 sweep of the stream's tiles, which the H200's table has never had, the
    # largest shapes first (a shape done is kept); the 8B step on its table, bf16 then int4 with
    # an int4 lm_head. Elsewhere: PLAN_ELSE (rows, big, w8, ...).
    if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        bash "$0" ${PLAN_ELSE:-rows}
        exit
    fi
    TP_RUNS="bf16 fp8kv" KV_KINDS="" T_TP=${T_TP:-140} bash "$0" fp8-kv
    PROBE_ROWS=1 PROBE_SPLITK=0 PROBE_SHAPES=28672x4096,4096x14336,6144x4096,4096x4096 T_PROBE=${T_PROBE:-150} \
        SKIP_TESTS=1 ROUNDS=0 bash "$0" w4a16
    [ -f "$OUT/w4a16-table.json" ] && export NEXTOK_W4A16_CONFIGS=$OUT/w4a16-table.json
    SKIP_PROBE=1 SKIP_TESTS=1 SKIP_INT4=1 ROUNDS=1 LM_HEAD=1 T_LAT=${T_LAT:-100} bash "$0" w4a16
    ;;
*)
    echo "usage: $0 w4a16|gguf|tests|lat256|decode|kernels|fp8-kv|rows|big|w8|plan" >&2
    exit 2
    ;;
esac
