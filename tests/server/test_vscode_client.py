"""The VS Code extension's request code (compiled JS, run with node) against the session's real
`nextok serve`: a completion through debounce/window/session id, an aborted request, and a bad
API key's error message. Lives here to share tests/server's `server` fixture."""
from __future__ import annotations

import json
import os
import subprocess

from tests.editors.vscode_build import REPO, compiled_out, require_node
from tests.server.conftest import MAIN_KEY

SCRIPT = os.path.join(REPO, "tests", "editors", "drive_vscode_client.cjs")


def test_vscode_client_against_real_server(server):
    node = require_node()
    out_dir = compiled_out()
    proc = subprocess.run([node, SCRIPT, out_dir, server.url, MAIN_KEY], capture_output=True, text=True,
                          timeout=180, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    print("vscode client:", json.dumps({"completion": r["completion"], "ms": r["ms"]}))

    assert r["probe"]["ready"] is True and r["probe"]["status"] == "ready"
    assert isinstance(r["completion"], str) and r["completion"].strip(), r
    assert [s["state"] for s in r["statuses"]] == ["busy", "ready"]
    assert r["statuses"][-1]["latencyMs"] > 0

    assert r["aborted"]["ok"] is False and r["aborted"]["name"] == "AbortError", r["aborted"]
    assert r["badKey"] == {"ok": False, "name": "ServerError", "status": 401, "message": "incorrect API key"}
    assert r["noKey"]["status"] == 401 and r["noKey"]["message"].startswith("missing API key")
