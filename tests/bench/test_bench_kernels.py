"""`nextok bench kernels`: the `--device cpu --quick` smoke run (Triton's interpreter, tiny shapes)
prints its table and writes the JSON; without a GPU the real run refuses in one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

FUSED_FIELDS = {"model", "op", "tokens", "shape", "bytes", "fused_us", "torch_us", "speedup",
                "fused_gbps", "torch_gbps", "fused_pct_of_copy", "max_abs_diff"}


def test_quick_cpu_run_writes_the_table_and_json(tmp_path):
    out = tmp_path / "kernels.json"
    # A fresh process: the interpreter must be on before triton compiles anything (on a GPU
    # machine this process may already hold the CUDA-compiled kernels).
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "nextok", "bench", "kernels", "--device", "cpu",
                           "--quick", "--output", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "add_rms_norm" in proc.stdout and "speedup" in proc.stdout
    result = json.loads(out.read_text())
    assert result["benchmark"] == "kernels" and result["device"] == "cpu" and result["quick"]
    assert {"commit", "machine", "command", "time_utc"} <= result.keys()
    assert result["copy_bandwidth_gbps"] > 0
    rows = result["fused"]
    assert sorted({r["op"] for r in rows}) == ["add_rms_norm", "rope_neox", "rope_neox_store_kv", "silu_mul"]
    assert sorted({r["tokens"] for r in rows}) == [1, 4]
    for r in rows:
        assert FUSED_FIELDS <= r.keys()
        assert r["fused_us"] > 0 and r["torch_us"] > 0 and r["bytes"] > 0
        assert r["max_abs_diff"] < 0.1  # bfloat16: the same roundings as the torch ops
    if result["attention_skipped"] is None:  # the Triton attention backend imports
        rows = result["attention"]
        assert [r["op"] for r in rows] == ["decode"] * 3 + ["prefill"]
        # the decode step on each cache dtype; a quantized row is read as 1 byte a value
        assert [r.get("kv_cache_dtype") for r in rows[:3]] == ["auto", "int8", "fp8"]
        baselines = {"decode": {"torch_ref_gather_sdpa"}, "prefill": {"naive", "sdpa_causal"}}
        for r in rows:
            if "error" in r:  # a failing backend is reported in its row, the table still runs
                assert r.keys() == {"op", "error"} and r["error"] in proc.stdout
                continue
            assert r["triton_us"] > 0 and r["max_abs_diff"] < 0.1
            assert r["baselines"].keys() == baselines[r["op"]]
        if not any("error" in r for r in rows[:3]):
            auto, int8, fp8 = (r["bytes"] for r in rows[:3])
            assert fp8 < int8 < auto  # bf16 rows of D x 2 bytes, int8 D + 4, fp8 D


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_without_cuda_the_real_run_refuses_in_one_line(capsys):
    from nextok.cli import main

    assert main(["bench", "kernels"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "CUDA" in err and "\n" not in err
