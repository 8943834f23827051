#!/usr/bin/env bash
# Builds llama.cpp's own `llama-server` (CPU, native) from the llama.cpp source vendored in the
# PyPI sdist of llama-cpp-python, once per machine: the binary is cached, later runs only check it.
# It is the benchmark peer of `nextok bench compare`, never a dependency of the engine.
#
#   benchmarks/peer/build_llama_server.sh [PYTHON]     prints the path of the binary on its last line
set -euo pipefail

PYTHON=${1:-python3}
VERSION=0.3.36
CACHE=${NEXTOK_CACHE:-$HOME/.cache/nextok}/peer/llama-cpp-python-$VERSION
BIN=$CACHE/bin/llama-server

# -march=native code is only valid on the CPU it was built on: key the cache by the CPU flags.
CPU_KEY=$( (grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || uname -m) | md5sum | cut -c1-12)
if [ -x "$BIN" ] && [ "$(cat "$CACHE/cpu-key" 2>/dev/null)" = "$CPU_KEY" ]; then
    echo "$BIN"; exit 0
fi

for tool in cmake c++; do
    command -v $tool >/dev/null || { echo "error: '$tool' is needed to build llama-server (apt-get install cmake g++)" >&2; exit 1; }
done

mkdir -p "$CACHE"
SRC=$CACHE/src
if [ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "$PYTHON" -m pip download --disable-pip-version-check -q --no-binary :all: --no-deps \
        "llama-cpp-python==$VERSION" -d "$tmp"
    rm -rf "$SRC" && mkdir -p "$SRC"
    tar xzf "$tmp"/llama_cpp_python-$VERSION.tar.gz -C "$SRC" --strip-components=1
fi

# Static, CPU only, no network features (no curl/OpenSSL, no web UI download): only the server.
cmake -S "$SRC/vendor/llama.cpp" -B "$CACHE/build" -G "$(command -v ninja >/dev/null && echo Ninja || echo 'Unix Makefiles')" \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
    > "$CACHE/configure.log" 2>&1 || { tail -30 "$CACHE/configure.log" >&2; exit 1; }
cmake --build "$CACHE/build" --target llama-server -j "$(nproc)" > "$CACHE/build.log" 2>&1 \
    || { tail -30 "$CACHE/build.log" >&2; exit 1; }

mkdir -p "$CACHE/bin"
cp "$CACHE/build/bin/llama-server" "$BIN"
echo "$CPU_KEY" > "$CACHE/cpu-key"
"$BIN" --version >&2 || true
echo "$BIN"
