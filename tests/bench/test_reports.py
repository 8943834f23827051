"""Result tables and CPU accounting of the benchmarks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from nextok.bench import keystroke_report
from nextok.bench.serve_bench import cpu_account, cpu_summary


def keystroke_result(p50, superseded, hit, other=None):
    dist = {"mean": p50, "median": p50, "std": 0.0, "p50": p50, "p90": p50, "p99": 2 * p50}
    return {"summary": {"num_sessions": 4, "num_requests": 100, "completed": 10, "superseded_share": superseded,
                        "latency_ms": dist, "ttft_ms": dist, "prefix_cache_hit_rate": hit},
            **({"cpu": {"other_processes_cpu_s": other}} if other is not None else {})}


def test_keystroke_table_shows_each_run_and_the_median_of_repeats():
    text = keystroke_report.table([("PSM", keystroke_result(100.0, 0.5, 0.6, 1.0)),
                                   ("SPM", keystroke_result(80.0, 0.4, 0.9, 0.5)),
                                   ("PSM", keystroke_result(300.0, 0.7, 0.5, 3.0)),
                                   ("SPM", keystroke_result(60.0, 0.2, 0.8))])
    lines = text.splitlines()
    assert len(lines) == 2 + 4 + 2  # header, 4 runs, 2 median rows
    psm = next(line for line in lines if line.startswith("| **PSM, median**"))
    cells = [c.strip() for c in psm.strip("|").split("|")]
    assert cells[1] == "2" and cells[5] == "60.0%" and cells[6] == "200" and cells[9] == "55.0%"
    spm = next(line for line in lines if line.startswith("| **SPM, median**"))
    assert spm.strip("|").split("|")[-1].strip() == "0.50"  # the run without CPU figures is left out


def test_keystroke_report_cli_writes_the_table(tmp_path):
    a = tmp_path / "a.json"
    a.write_text(json.dumps(keystroke_result(50.0, 0.1, 0.9)))
    out = tmp_path / "t.md"
    proc = subprocess.run([sys.executable, "-m", "nextok.bench.keystroke_report", str(out), f"one run={a}"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "| one run | 1 | 4 | 100 | 10 | 10.0% | 50 | 100 | 50 | 90.0% | n/a |" in out.read_text()
    bad = subprocess.run([sys.executable, "-m", "nextok.bench.keystroke_report", str(out), str(a)],
                         capture_output=True, text=True)
    assert bad.returncode == 2


def test_cpu_account_tells_the_server_from_other_processes():
    import psutil

    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.6: pass\ntime.sleep(60)"])
    try:
        with cpu_account(child.pid) as cpu:
            while sum(psutil.Process(child.pid).cpu_times()[:2]) < 0.6:  # busy, then asleep
                time.sleep(0.05)
    finally:
        child.kill()
    s = cpu_summary(cpu, child.pid)
    assert s["server_cpu_s"] >= 0.3  # the busy child was counted as the server
    assert set(s) == {"client_cpu_s", "steal_s", "server_cpu_s", "other_processes_cpu_s"}
    with cpu_account(None) as cpu:
        pass
    assert "server_and_other_processes_cpu_s" in cpu_summary(cpu, None)
    with pytest.raises(ValueError, match="--server-pid"):
        cpu_account(2 ** 22 + 12345)
