#!/bin/bash
# Prepares what benchmarks/gpu/issue6.sh reads on the GPU machine, which has no network:
#   .gpucarry/gguf_a/part, gguf_b        the default GGUF in two halves (a call carries <= 64 MiB,
#                                        the tracked files ~12 MiB of it)
#   .gpucarry/gguf.sha256                its sha256, checked after the halves are joined there
#   .gpucarry/smollm2-135m/              a tokenizer directory for the dummy checkpoints
#   .whl/                                the gguf wheel transformers needs to read the GGUF
# Both folders are ignored through .git/info/exclude and travel with `carry`. Run from the
# repo root after `make model`: bash benchmarks/gpu/make_carry.sh
set -eu
PY=${PY:-.venv/bin/python}
MODEL=$($PY -m nextok.hub path 2>/dev/null || echo "$HOME/.cache/nextok/models/SmolLM2-135M-Instruct.Q4_1.gguf")
[ -f "$MODEL" ] || { echo "error: $MODEL missing (run make model)" >&2; exit 1; }
for p in /.gpucarry/ /.whl/; do grep -qxF "$p" .git/info/exclude 2>/dev/null || echo "$p" >> .git/info/exclude; done
rm -rf .gpucarry/gguf_c  # a third part, from when the tracked files were larger
mkdir -p .gpucarry/gguf_a .gpucarry/gguf_b .whl
size=$(stat -c %s "$MODEL")
half=$(( (size + 1) / 2 ))
head -c $half "$MODEL" > .gpucarry/gguf_a/part
tail -c +$(( half + 1 )) "$MODEL" > .gpucarry/gguf_b/part
sha256sum "$MODEL" | cut -c1-64 > .gpucarry/gguf.sha256
$PY -c "import sys; from nextok.tokenizer import Tokenizer; Tokenizer.from_gguf(sys.argv[1]).save(sys.argv[2])" \
    "$MODEL" .gpucarry/smollm2-135m
ls .whl/gguf-0.19.0-*.whl >/dev/null 2>&1 || $PY -m pip download -q --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp -d .whl gguf==0.19.0
cat .gpucarry/gguf_{a,b}/part | sha256sum | cut -c1-64 | cmp -s - .gpucarry/gguf.sha256
mkdir -p .gpucarry/tok && tar -C .gpucarry -czf .gpucarry/tok/smollm2-135m.tgz smollm2-135m
du -sh .gpucarry/* .whl
