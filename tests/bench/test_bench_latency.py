"""`nextok bench latency` on CPU with the default model: one small round, the JSON's fields and its
roofline arithmetic (weights read per step, KV per token, the fraction)."""
from __future__ import annotations

import json

from nextok.cli import main


def test_latency_run_writes_its_figures(tmp_path, model_path):
    out = tmp_path / "latency.json"
    rc = main(["bench", "latency", "--model", model_path, "--dtype", "float32", "--batch-sizes", "1,2",
               "--input-len", "16", "--output-len", "4", "--repeats", "1", "--also-eager", "--also-sync",
               "--kv-cache-memory", "64MiB", "--output", str(out)])
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["benchmark"] == "latency" and r["device"] == "cpu" and r["cuda_graphs"] is False
    # SmolLM2-135M: 134.5M float32 weights; a decode step reads them as GGUF blocks, ~5 bits per
    # Q4_1 weight and ~8.5 per Q8_0 (the tied embedding, read once as the lm_head)
    assert 530e6 < r["param_bytes"] < 545e6
    assert 85e6 < r["weight_bytes_per_step"] < 100e6
    assert r["kv_bytes_per_token"] == 2 * 30 * 3 * 64 * 4
    assert r["copy_bandwidth_GBps"] > 0
    mem = r["memory"]  # per method: how weights and cache are held, and the process's peak
    assert mem["quantization"] is None and mem["kv_cache_dtype"] == "auto"
    assert mem["weight_bytes"] == r["param_bytes"]
    assert mem["kv_cache_bytes"] <= 64 << 20 and mem["kv_cache_bytes"] % (2 * 30 * 3 * 64 * 4) == 0
    assert mem["peak_rss_mib"] > mem["weight_bytes"] / 2**20
    assert set(r["summary"]) == {"nextok", "nextok_eager", "nextok_sync"}
    for name in ("nextok", "nextok_eager", "nextok_sync"):
        for b in ("1", "2"):
            row = r["summary"][name][b]
            assert row["decode_step_ms"] > 0 and row["prefill_ms"] > 0
            expect = (r["weight_bytes_per_step"] + int(b) * (16 + 4 / 2) * r["kv_bytes_per_token"]) \
                / (r["copy_bandwidth_GBps"] * 1e9) * 1e3
            assert abs(row["roofline_ms"] - expect) < 1e-6 * expect
            assert abs(row["fraction_of_roofline"] - row["roofline_ms"] / row["decode_step_ms"]) < 1e-9


def test_latency_roofline_counts_the_pools_own_rows(tmp_path, model_path):
    """--kv-cache-dtype int8: a token's cached rows are D int8 and a float32 scale per layer, K
    and V, KV head (the roofline once counted the model's float32 width)."""
    out = tmp_path / "latency.json"
    assert main(["bench", "latency", "--model", model_path, "--batch-sizes", "1", "--input-len", "16",
                 "--output-len", "2", "--repeats", "1", "--kv-cache-memory", "32MiB",
                 "--kv-cache-dtype", "int8", "--output", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["kv_bytes_per_token"] == 2 * 30 * 3 * (64 + 4)
    assert r["memory"]["kv_cache_dtype"] == "int8"
