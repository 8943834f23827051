"""`nextok:device_memory_*_bytes`: sampled at scrape time, CPU always, CUDA only once initialised."""
from __future__ import annotations

import sys
import types

from nextok.server.metrics import ServerMetrics, device_memory
from tests.server.conftest import metric_value


def test_cpu_row_is_the_process_rss_against_host_ram():
    text = ServerMetrics("m").render().decode()
    used = metric_value(text, "nextok:device_memory_used_bytes", device="cpu")
    total = metric_value(text, "nextok:device_memory_total_bytes", device="cpu")
    assert 0 < used < total


def _fake_torch(initialized: bool):
    cuda = types.SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: initialized, device_count=lambda: 2,
        memory_reserved=lambda i: (i + 1) * 1000,
        get_device_properties=lambda i: types.SimpleNamespace(total_memory=80_000))
    return types.SimpleNamespace(cuda=cuda)


def test_cuda_rows_per_initialised_device(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(initialized=True))
    rows = device_memory()
    assert rows[1:] == [("cuda:0", 1000, 80_000), ("cuda:1", 2000, 80_000)]
    text = ServerMetrics("m").render().decode()
    assert metric_value(text, "nextok:device_memory_used_bytes", device="cuda:1") == 2000


def test_no_cuda_rows_before_cuda_is_initialised(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(initialized=False))
    assert [d for d, _, _ in device_memory()] == ["cpu"]
