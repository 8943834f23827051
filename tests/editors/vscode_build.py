"""The VS Code extension's Node.js side, for the tests: npm packages installed once per
package-lock.json (`make editors` does the same, with the same stamp) and the compiled JS."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VSCODE_DIR = os.path.join(REPO, "editors", "vscode")
STAMP = os.path.join(VSCODE_DIR, "node_modules", ".nextok-installed")


def require_node() -> str:
    """The node binary; skips (fails under CI) when Node.js or npm is missing."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        if os.environ.get("CI"):
            pytest.fail("node/npm are not installed: `make editors` should have installed them")
        pytest.skip("node/npm are not installed (make editors, or apt-get install nodejs npm)")
    return node


def run(*cmd: str, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=VSCODE_DIR, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "0"})
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def ensure_node_modules() -> None:
    """`npm ci` unless node_modules is already installed from the current package-lock.json."""
    lock = os.path.join(VSCODE_DIR, "package-lock.json")
    if os.path.exists(STAMP) and os.path.getmtime(STAMP) >= os.path.getmtime(lock):
        return
    run("npm", "ci", "--no-audit", "--no-fund", timeout=600)
    open(STAMP, "w").close()


def compiled_out() -> str:
    """Builds the extension (tsc) and returns its output folder."""
    require_node()
    ensure_node_modules()
    run("npm", "run", "--silent", "compile")
    return os.path.join(VSCODE_DIR, "out")
