"""`nextok bench serve` as a user runs it, against the real server of this session."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.server.conftest import MAIN_KEY


def bench(server_url, tmp_path, *args, key=MAIN_KEY):
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-m", "nextok", "bench", "serve", "--base-url", server_url,
                           "--api-key", key, "--no-progress", "--output", str(out), *args],
                          capture_output=True, text=True, timeout=600)
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def test_random_workload_counts_every_token(server, tmp_path):
    proc, result = bench(server.url, tmp_path, "--dataset", "random", "--num-requests", "4",
                         "--input-len", "24", "--output-len", "6", "--max-concurrency", "2",
                         "--slo", "ttft=60s", "--save-requests")
    assert proc.returncode == 0, proc.stderr
    s = result["summary"]
    assert (s["completed"], s["failed"]) == (4, 0)
    # EOS ignored: exactly output-len tokens each; prompt tokens as the server's usage reports them
    assert s["total_output_tokens"] == 24 and s["total_input_tokens"] == 4 * 24
    assert s["goodput"] == s["request_throughput"]
    assert all(len(r["itl"]) >= 1 and r["ttft"] > 0 for r in result["requests"])
    assert result["commit"] and result["machine"] and "bench serve" in result["command"]
    assert "Output token throughput" in proc.stdout


def test_code_dataset_through_chat_free_completions(server, tmp_path):
    proc, result = bench(server.url, tmp_path, "--dataset", "code", "--num-requests", "2",
                         "--input-len", "48", "--output-len", "4", "--request-rate", "20", "--seed", "5")
    assert proc.returncode == 0, proc.stderr
    assert result["summary"]["completed"] == 2 and result["summary"]["total_input_tokens"] == 96


def test_wrong_key_is_reported_as_failed_requests(server, tmp_path):
    proc, result = bench(server.url, tmp_path, "--num-requests", "1", "--input-len", "8",
                         "--output-len", "2", "--served-model-name", "smollm2-135m-instruct", key="wrong")
    assert proc.returncode == 1
    assert result["summary"]["failed"] == 1
    assert any(e.startswith("HTTP 401") for e in result["summary"]["errors"])


def test_bad_arguments_fail_before_any_request(server, tmp_path):
    proc, result = bench(server.url, tmp_path, "--slo", "speed=fast")
    assert proc.returncode == 1 and "bad SLO" in proc.stderr and result is None


def test_unusable_server_is_one_clear_line(server, tmp_path):
    proc, _ = bench(server.url, tmp_path, "--num-requests", "1", key="wrong")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("error: GET ") and "HTTP 401" in proc.stderr
    proc, _ = bench("http://127.0.0.1:9", tmp_path, "--num-requests", "1")
    assert proc.returncode == 1 and "cannot reach" in proc.stderr
