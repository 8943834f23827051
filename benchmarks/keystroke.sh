#!/usr/bin/env bash
# The keystroke rows of BENCHMARKS.md, reproducible on any machine:
#   1. nextok on the default model (SmolLM2-135M-Instruct, no FIM tokens: prefix completion);
#   2. SPM vs PSM on a FIM model with random weights (SmolLM2-135M's shape and tokenizer plus
#      StarCoder2's FIM tokens, written by nextok.bench.fim_model), runs interleaved psm, spm, ...
# Each run: 4 editor sessions (Python, C, JavaScript, Go files where found), one at a time as one
# developer types, a request every 3 characters at 8 characters/s, a 1 s pause after each line.
#
#   benchmarks/keystroke.sh [OUTPUT_DIR] [PAIRS]
set -euo pipefail
OUT=${1:-benchmarks/results}
PAIRS=${2:-2}
DATE=$(date -u +%F)
NEXTOK=${NEXTOK:-.venv/bin/nextok}
PY=${PY:-.venv/bin/python}
THREADS=${THREADS:-$(nproc)}
WORK=$(mktemp -d)
RUN=(--dataset keystroke --num-sessions 4 --concurrent-sessions 1 --typed-chars 120:240 --no-progress)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT
mkdir -p "$OUT"

start_server() {  # PORT LOG ARGS... -> starts `nextok serve`, waits until ready
    local port=$1 log=$2; shift 2
    "$NEXTOK" serve --host 127.0.0.1 --port "$port" --num-threads "$THREADS" "$@" > "$log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 300); do
        curl -sf "http://127.0.0.1:$port/ready" > /dev/null && return 0
        kill -0 "${PIDS[-1]}" 2>/dev/null || { cat "$log" >&2; return 1; }
        sleep 1
    done
    echo "server on port $port not ready" >&2; return 1
}

bench() {  # PORT PID OUTPUT ARGS...
    local port=$1 pid=$2 out=$3; shift 3
    "$NEXTOK" bench serve --base-url "http://127.0.0.1:$port" --server-pid "$pid" "${RUN[@]}" --output "$out" "$@"
}

# 1. the default model
start_server 8601 "$WORK/smollm2.log"
bench 8601 "${PIDS[-1]}" "$OUT/$DATE-keystroke-smollm2.json" --seed 0
kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true

# 2. SPM vs PSM: both servers up (an idle one takes no CPU), runs alternate; each pair of runs
#    types other spans (its own seed), so no run finds the previous one's prompts in the cache
"$PY" -m nextok.bench.fim_model "$WORK/fim"
start_server 8602 "$WORK/psm.log" --model "$WORK/fim" --load-format dummy --fim-order psm
PSM=${PIDS[-1]}
start_server 8603 "$WORK/spm.log" --model "$WORK/fim" --load-format dummy --fim-order spm
SPM=${PIDS[-1]}
ROWS=("nextok, SmolLM2-135M (no FIM: prefix only)=$OUT/$DATE-keystroke-smollm2.json")
for pair in $(seq "$PAIRS"); do
    bench 8602 "$PSM" "$OUT/$DATE-keystroke-fim-psm-$pair.json" --seed "$pair"
    bench 8603 "$SPM" "$OUT/$DATE-keystroke-fim-spm-$pair.json" --seed "$pair"
    ROWS+=("FIM model, PSM=$OUT/$DATE-keystroke-fim-psm-$pair.json" "FIM model, SPM=$OUT/$DATE-keystroke-fim-spm-$pair.json")
done
"$PY" -m nextok.bench.keystroke_report "$OUT/$DATE-keystroke.md" "${ROWS[@]}"
