"""The deployment checkers: found in the venv (`make deploy-tools`) or on PATH, else skipped
(failed under CI, where `make test` has installed them)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
DOCKER_CONFIG = ROOT / ".venv" / "docker"  # holds cli-plugins/docker-compose (make deploy-tools)


def tool(name: str, how: str = "make deploy-tools") -> str:
    for candidate in (VENV_BIN / name, ROOT / ".venv" / "bin" / name):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    missing(name, how)


def missing(name: str, how: str):
    if os.environ.get("CI"):
        pytest.fail(f"{name} is not installed: `{how}` should have installed it")
    pytest.skip(f"{name} is not installed ({how})")


def run(cmd: list[str], stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, **(env or {})})


def ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"{proc.args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
