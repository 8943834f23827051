"""The GPU session's scripts (benchmarks/gpu/) parse, and their shared deadline works: a device call
is killed at its limit with whatever its steps left, so a script that fails to parse or a step
that overruns costs a scarce call. Checked here, where they cannot run."""
from __future__ import annotations

import os
import py_compile
import subprocess
from pathlib import Path

import pytest

GPU = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"


@pytest.mark.parametrize("script", sorted(p.name for p in GPU.glob("*.sh")))
def test_shell_scripts_parse(script):
    run = subprocess.run(["bash", "-n", str(GPU / script)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("script", sorted(p.name for p in GPU.glob("*.py")))
def test_python_scripts_compile(script, tmp_path):
    py_compile.compile(str(GPU / script), cfile=str(tmp_path / "out.pyc"), doraise=True)


def _steps(body: str, **env) -> subprocess.CompletedProcess:
    """Runs body after sourcing deadline.sh, as the scripts do (from the repo root)."""
    return subprocess.run(["bash", "-c", f"set -u; . benchmarks/gpu/deadline.sh; {body}"],
                          capture_output=True, text=True, cwd=GPU.parents[1], timeout=60,
                          env={k: v for k, v in os.environ.items() if not k.startswith("DEADLINE")} | env)


def test_a_step_gets_its_cap_or_what_is_left_of_the_deadline():
    assert _steps("t_for 100").stdout.split() == ["100"]  # no deadline: the cap
    left = int(_steps("t_for 100", DEADLINE="60").stdout)
    assert 50 <= left <= 55  # the deadline less a 5 s margin
    assert _steps("t_for 10", DEADLINE="60").stdout.split() == ["10"]


def test_a_step_past_the_deadline_is_skipped_and_the_next_ones_too():
    run = _steps("run_for 100 echo first; echo rc=$?; run_for 5 echo second", DEADLINE="30")
    assert "skipped (deadline): echo first" in run.stdout and "rc=124" in run.stdout
    assert "skipped (deadline): echo second" in run.stdout
    assert "first" not in run.stdout.splitlines()  # echo first never ran


def test_a_step_runs_under_its_timeout_with_its_environment():
    run = _steps("FOO=bar run_for 100 sh -c 'echo FOO=$FOO'; run_for 1 sleep 5; echo rc=$?",
                 DEADLINE="200", MIN_STEP="0")
    assert "FOO=bar" in run.stdout
    assert "rc=124" in run.stdout  # sleep 5 killed at 1 s


def test_scripts_in_one_call_share_one_deadline():
    """DEADLINE_AT (epoch seconds) set once holds for every script sourced after it."""
    run = _steps('echo $DEADLINE_AT; bash -c ". benchmarks/gpu/deadline.sh; echo \\$DEADLINE_AT"',
                 DEADLINE="100")
    first, second = run.stdout.split()
    assert first == second


def test_dot_probe_routes_eight_rows_to_the_faster_kernel(monkeypatch):
    """w4a16_dot_probe at 8 rows: the table's "8" entry keeps its dp4a tile and gets "dot": true
    only where tl.dot on the "16" tile was faster (times from stubs), whichever it had before."""
    import torch

    monkeypatch.syspath_prepend(str(GPU))
    probe = pytest.importorskip("w4a16_dot_probe")
    dp4a = dict(BLOCK_N=64, TW=32, num_warps=4, num_stages=3, SPLIT=4, BLOCK_M=8)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a GPU")
    x = torch.zeros(8, 256)
    for dot_us, dp4a_us, kept8, want_dot in ((40.0, 50.0, dp4a, True), (60.0, 50.0, dp4a, False),
                                             (45.0, 40.0, dict(dp4a, dot=True), False),
                                             (45.0, 50.0, dict(dp4a, dot=True), True)):
        monkeypatch.setattr(probe.tiles, "_tuned", lambda name, kept8=kept8: {"64x256": {"8": kept8}})
        monkeypatch.setattr(probe, "time_tile", lambda cfg, *a, d=dot_us, p=dp4a_us:
                            dict(cfg, us=d if cfg.get("dot") else p, max_diff=0.0))
        table = {}
        r = probe.dp4a_or_dot(64, 256, x, [], None, 2, None, table, torch.device("cpu"))
        assert table["64x256"]["8"] == (dict(dp4a, dot=True) if want_dot else dp4a), (dot_us, dp4a_us, kept8)
        assert r["rows"] == 8 and r["dp4a"]["us"] == dp4a_us and r["dot_16_tile"]["us"] == dot_us
