"""Device and dtype choice, with the CPU flag reader and CUDA availability faked."""
from __future__ import annotations

import logging

import pytest
import torch

from nextok import platform
from nextok.errors import NextokError

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480C
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480C
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile
"""


@pytest.fixture
def flags(monkeypatch):
    """Set the CPU flags the code sees: flags({'avx2'})."""
    def set_flags(values):
        monkeypatch.setattr(platform, "cpu_flags", lambda: set(values))
    return set_flags


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_parse_cpuinfo():
    model, flags = platform.parse_cpuinfo(CPUINFO)
    assert model == "Intel(R) Xeon(R) Platinum 8480C"
    assert {"avx2", "avx512_bf16", "amx_bf16"} <= flags and "processor" not in flags
    assert platform.parse_cpuinfo("") == (None, set())


def test_cpu_flags_from_cpuinfo_and_torch_fallback(monkeypatch):
    platform.cpu_flags.cache_clear()
    monkeypatch.setattr(platform, "_read_cpuinfo", lambda: CPUINFO)
    assert "amx_bf16" in platform.cpu_flags()
    platform.cpu_flags.cache_clear()
    monkeypatch.setattr(platform, "_read_cpuinfo", lambda: "")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert platform.cpu_flags() == {"avx2", "avx512f"}
    platform.cpu_flags.cache_clear()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    assert platform.cpu_flags() == set()
    platform.cpu_flags.cache_clear()


def test_cpu_flags_read_once(monkeypatch):
    platform.cpu_flags.cache_clear()
    reads = []
    monkeypatch.setattr(platform, "_read_cpuinfo", lambda: reads.append(1) or CPUINFO)
    platform.cpu_flags()
    platform.cpu_flags()
    assert len(reads) == 1
    platform.cpu_flags.cache_clear()


@pytest.mark.parametrize("values, native", [
    ({"avx2", "avx512f"}, False), ({"avx512_bf16"}, True), ({"amx_bf16"}, True), (set(), False)])
def test_cpu_has_native_bf16(flags, values, native):
    flags(values)
    assert platform.cpu_has_native_bf16() is native


def test_auto_dtype_on_cpu(flags):
    flags({"avx2", "avx512f"})
    assert platform.resolve_dtype("auto", "cpu") == "float32"
    flags({"avx2", "avx512f", "avx512_bf16"})
    assert platform.resolve_dtype("auto", "cpu") == "bfloat16"
    assert platform.resolve_dtype("AUTO", "cpu") == "bfloat16"


def test_auto_dtype_on_cuda(flags, monkeypatch):
    flags(set())  # the CPU does not matter on CUDA
    monkeypatch.setattr(platform, "_cuda_bf16_supported", lambda: True)
    assert platform.resolve_dtype("auto", "cuda") == "bfloat16"
    assert platform.resolve_dtype("auto", "cuda:1") == "bfloat16"
    monkeypatch.setattr(platform, "_cuda_bf16_supported", lambda: False)  # pre-Ampere GPUs
    assert platform.resolve_dtype("auto", "cuda") == "float16"


@pytest.mark.parametrize("name, want", [
    ("float32", "float32"), ("fp32", "float32"), ("float", "float32"), ("FP32", "float32"),
    ("bfloat16", "bfloat16"), ("bf16", "bfloat16"),
    ("float16", "float16"), ("fp16", "float16"), ("half", "float16")])
def test_dtype_names(name, want):
    assert platform.resolve_dtype(name, "cuda") == want
    assert hasattr(torch, want)


def test_unknown_dtype():
    with pytest.raises(NextokError, match="unknown dtype 'int8'.*float32, bfloat16 or float16"):
        platform.resolve_dtype("int8", "cpu")


def test_float16_on_cpu_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="nextok"):
        assert platform.resolve_dtype("fp16", "cpu") == "float16"
    assert "float16 on CPU" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nextok"):
        platform.resolve_dtype("fp16", "cuda")
        platform.resolve_dtype("fp32", "cpu")
    assert caplog.text == ""


def test_resolve_device_without_cuda(no_cuda):
    assert platform.resolve_device("auto") == "cpu"
    assert platform.resolve_device("CPU") == "cpu"
    for d in ("cuda", "cuda:0"):
        with pytest.raises(NextokError, match="CUDA is not available.*--device cpu"):
            platform.resolve_device(d)
    with pytest.raises(NextokError, match="unknown device 'tpu'"):
        platform.resolve_device("tpu")


def test_resolve_device_with_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert platform.resolve_device("auto") == "cuda"
    assert platform.resolve_device("cuda") == "cuda"
    assert platform.resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(NextokError, match="2 GPUs"):
        platform.resolve_device("cuda:2")


def test_describe_machine(flags, no_cuda):
    flags({"avx2", "amx_bf16"})
    info = platform.describe_machine()
    assert info["cpu_flags"] == {"avx2": True, "avx512f": False, "avx512_bf16": False,
                                 "amx_bf16": True}
    assert info["cpu_count"] >= 1 and info["memory_total_bytes"] > 0
    assert info["torch_version"] == torch.__version__ and info["cuda_device"] is None
    assert isinstance(info["cpu_model"], str) and info["cpu_model"]
