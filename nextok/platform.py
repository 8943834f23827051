"""Device and dtype, decided once from the machine; and the machine's description for benchmarks.

`auto` dtype means bfloat16 where the hardware computes it natively (CUDA; x86 CPUs with
AVX512-BF16 or AMX-BF16) and float32 elsewhere: on a CPU without those units bf16 matmuls are
emulated and run slower than fp32.
"""
from __future__ import annotations

import functools
import logging
import os
import platform as _stdlib_platform

from nextok.errors import NextokError

log = logging.getLogger("nextok")

FLAGS_OF_INTEREST = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
DTYPE_ALIASES = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
}
# torch.backends.cpu.get_cpu_capability() -> the /proc/cpuinfo flags it implies
_CAPABILITY_FLAGS = {"AVX2": {"avx2"}, "AVX512": {"avx2", "avx512f"}}


def _read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def parse_cpuinfo(text: str) -> tuple[str | None, set[str]]:
    """(model name, flags) of the first processor in /proc/cpuinfo text."""
    model, flags = None, None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if key == "model name" and model is None:
            model = value.strip()
        elif key in ("flags", "features") and flags is None:  # "Features" on aarch64
            flags = set(value.split())
    return model, flags or set()


@functools.cache
def cpu_flags() -> set[str]:
    """CPU feature flags from /proc/cpuinfo, else what torch's CPU capability implies."""
    _, flags = parse_cpuinfo(_read_cpuinfo())
    if flags:
        return flags
    import torch

    return set(_CAPABILITY_FLAGS.get(torch.backends.cpu.get_cpu_capability(), ()))


def cpu_has_native_bf16() -> bool:
    flags = cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_device(device: str) -> str:
    """`auto` -> `cuda` if torch sees a GPU, else `cpu`; `cuda[:N]` without CUDA is an error."""
    import torch

    d = (device or "auto").strip().lower()
    if d == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if d == "cpu":
        return d
    if d == "cuda" or d.startswith("cuda:"):
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else "no visible GPU"
            raise NextokError(f"--device {device}: CUDA is not available (torch "
                              f"{torch.__version__}, {build}); use --device cpu or auto")
        index = d.partition(":")[2]
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            raise NextokError(f"--device {device}: there are {torch.cuda.device_count()} GPUs")
        return d
    raise NextokError(f"unknown device {device!r}; choose auto, cpu or cuda")


def resolve_dtype(dtype: str, device: str) -> str:
    """`auto` -> bfloat16 on CUDA and on CPUs with native bf16, float32 otherwise.

    Returns one of "float32", "bfloat16", "float16" (torch attribute names).
    """
    d = (dtype or "auto").strip().lower()
    on_cuda = device.startswith("cuda")
    if d == "auto":
        if on_cuda:
            return "bfloat16" if _cuda_bf16_supported() else "float16"
        return "bfloat16" if cpu_has_native_bf16() else "float32"
    if d not in DTYPE_ALIASES:
        raise NextokError(f"unknown dtype {dtype!r}; choose auto, float32, bfloat16 or float16 "
                          f"(or fp32, bf16, fp16)")
    name = DTYPE_ALIASES[d]
    if name == "float16" and not on_cuda:
        log.warning("float16 on CPU is slow and less accurate than bfloat16/float32; "
                    "use --dtype auto unless you are testing float16 itself")
    return name


def _cuda_bf16_supported() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def describe_machine() -> dict:
    """What every benchmark result records about where it ran."""
    import psutil
    import torch

    model, _ = parse_cpuinfo(_read_cpuinfo())
    flags = cpu_flags()
    info = {
        "cpu_model": model or _stdlib_platform.processor() or _stdlib_platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_count_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "cpu_flags": {f: f in flags for f in FLAGS_OF_INTEREST},
        "torch_threads": torch.get_num_threads(),
        "memory_total_bytes": psutil.virtual_memory().total,
        "os": _stdlib_platform.platform(),
        "python": _stdlib_platform.python_version(),
        "torch_version": torch.__version__,
        "cuda_device": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(cuda_device=props.name, cuda_device_count=torch.cuda.device_count(),
                    cuda_memory_total_bytes=props.total_memory, cuda_version=torch.version.cuda)
    return info
