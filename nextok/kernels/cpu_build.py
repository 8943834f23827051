"""Builds nextok's small C kernels (kernels/csrc/*.c) with the system C compiler, once per machine.

The shared library is cached under `<nextok cache>/kernels/`, keyed by the source, the flags and
the CPU's flags (and csrc/*.h): `-march=native` code built on an AVX-512 machine must not run on an AVX2 one.
Any failure (no compiler, a compile error, a load error) returns None and the caller keeps its
torch path, so a machine without gcc still runs, only slower. No torch headers: the kernels take
raw pointers through ctypes (a build takes about a second, not the minute of a torch extension).
"""
from __future__ import annotations

import ctypes
import glob
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile

log = logging.getLogger("nextok")

CSRC = os.path.join(os.path.dirname(__file__), "csrc")
# -fno-math-errno lets `omp simd` loops call glibc's vectorized expf.
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-shared", "-fPIC", "-std=gnu11"]
_LOADED: dict[str, ctypes.CDLL | None] = {}


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc:
        return cc
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return name
    return None


def load(name: str) -> ctypes.CDLL | None:
    """The compiled `csrc/<name>.c` as a ctypes library, or None if it cannot be had."""
    if name not in _LOADED:
        _LOADED[name] = _build_and_load(name)
    return _LOADED[name]


def _build_and_load(name: str) -> ctypes.CDLL | None:
    from nextok import hub, platform

    cc = _compiler()
    if cc is None:
        log.warning("no C compiler found: %s runs on the slower torch path", name)
        return None
    with open(os.path.join(CSRC, name + ".c"), "rb") as f:
        source = f.read()
    for header in sorted(glob.glob(os.path.join(CSRC, "*.h"))):  # a .c may include any of them
        with open(header, "rb") as f:
            source += f.read()
    key = hashlib.sha256(source + " ".join([cc, *FLAGS, *sorted(platform.cpu_flags())]).encode())
    out_dir = os.path.join(hub.cache_dir(), "kernels")
    lib_path = os.path.join(out_dir, f"{name}-{key.hexdigest()[:16]}.so")
    try:
        if not os.path.exists(lib_path):
            os.makedirs(out_dir, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
            os.close(fd)
            cmd = [cc, *FLAGS, "-o", tmp, os.path.join(CSRC, name + ".c"), "-lm"]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            if proc.returncode != 0:
                os.unlink(tmp)
                log.warning("building %s failed (torch path used instead): %s", name,
                            proc.stderr.strip()[-500:])
                return None
            os.replace(tmp, lib_path)  # atomic: a concurrent build just wins or loses the race
        return ctypes.CDLL(lib_path)
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("could not build or load %s (torch path used instead): %s", name, e)
        return None
