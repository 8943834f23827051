"""The CPU KV pool is zeroed but committed page by page (worker/cpu_memory.py lazy_zeros): a
pool of N bytes costs no resident memory until its blocks are written."""
from __future__ import annotations

import os

import pytest
import torch

from nextok.worker.cpu_memory import lazy_zeros

PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads Linux's resident set size")
def test_lazy_zeros_commit_only_written_pages():
    before = _rss()
    t = lazy_zeros((64, 16, 64, 1024), torch.float32)  # 256 MiB
    assert t.shape == (64, 16, 64, 1024) and t.dtype == torch.float32 and t.is_contiguous()
    assert _rss() - before < 32 << 20  # not committed on creation
    assert t[::7, ::5].abs().sum().item() == 0  # reading untouched pages: zeros, still not committed
    assert _rss() - before < 32 << 20
    t[:16] = 1.5  # a quarter written (64 MiB): committed
    assert 48 << 20 < _rss() - before < 128 << 20
    assert t.sum().item() == 1.5 * 16 * 16 * 64 * 1024


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int8, torch.float8_e4m3fn])
def test_lazy_zeros_in_each_kv_dtype(dtype):
    t = lazy_zeros((3, 16, 2, 8), dtype)
    assert t.dtype == dtype and t.shape == (3, 16, 2, 8) and t.float().abs().sum().item() == 0
    t[1, 2] = 1
    assert t.float().sum().item() == 16
    assert lazy_zeros((0, 8), dtype).shape == (0, 8)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads Linux's resident set size")
def test_cpu_runner_pools_are_lazy(llm_f32):
    """The default model's runner makes its KV pools (the engine's, a draft's) this way: 512
    blocks of every layer (~370 MB in float32) cost no resident memory until written."""
    runner = llm_f32.engine.runner
    before = _rss()
    pools = runner.new_kv_caches(512)
    size = sum(t.numel() * t.element_size() for pair in pools for t in pair)
    assert size > 256 << 20 and _rss() - before < 32 << 20
    assert not any(t.any() for pair in pools for t in pair)
