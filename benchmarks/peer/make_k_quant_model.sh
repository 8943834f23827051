#!/usr/bin/env bash
# Writes the default model requantized by llama.cpp's own `llama-quantize` (K-quant mixes such as
# Q4_K_M, or Q4_0), for benchmarks and checks of nextok's K-quant block kernels. No PyPI wheel ships
# a K-quant file of the default model, so one is made from the Q4_1 file (--allow-requantize: the
# weights are quantized twice, so judge speed and packed-vs-dequantized agreement on it, not
# quality). llama-quantize is built once into the `make peer` build tree (a minute after the peer).
#
#   benchmarks/peer/make_k_quant_model.sh [TYPE [PYTHON]]    TYPE: Q4_K_M (default), Q5_K_M, Q4_0, ...
# prints the path of the file on its last line.
set -euo pipefail

TYPE=${1:-Q4_K_M}
PYTHON=${2:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
"$HERE/build_llama_server.sh" "$PYTHON" >/dev/null  # the peer's build tree, configured and cached
CACHE=${NEXTOK_CACHE:-$HOME/.cache/nextok}
BUILD=$CACHE/peer/llama-cpp-python-0.3.36/build
QUANTIZE=$BUILD/bin/llama-quantize
if [ ! -x "$QUANTIZE" ]; then
    cmake --build "$BUILD" --target llama-quantize -j "$(nproc)" > "$BUILD/../quantize-build.log" 2>&1 \
        || { tail -30 "$BUILD/../quantize-build.log" >&2; exit 1; }
fi
SRC=$("$PYTHON" -m nextok.hub pull)  # the default model, fetched and cached if missing
OUT=$CACHE/models/$(basename "$SRC" .Q4_1.gguf).$TYPE.gguf
if [ ! -f "$OUT" ]; then
    "$QUANTIZE" --allow-requantize "$SRC" "$OUT.tmp" "$TYPE" 2 > "$OUT.log" 2>&1 || { tail -20 "$OUT.log" >&2; exit 1; }
    mv "$OUT.tmp" "$OUT"
fi
echo "$OUT"
