"""The VS Code extension builds, passes its unit tests (vitest, a fake `vscode` module) and
packages as a .vsix. Its request code against a real server: tests/server/test_vscode_client.py."""
from __future__ import annotations

import json
import re
import zipfile

import pytest

from tests.editors.vscode_build import ensure_node_modules, require_node, run


@pytest.fixture(scope="module")
def node_modules():
    require_node()
    ensure_node_modules()


def test_unit_tests_pass(node_modules):
    out = run("npx", "vitest", "run").stdout
    files = re.search(r"Test Files\s+(\d+) passed \((\d+)\)", out)
    tests = re.search(r"Tests\s+(\d+) passed \((\d+)\)", out)
    assert files and tests, out
    assert files.group(1) == files.group(2) and tests.group(1) == tests.group(2), out
    assert int(tests.group(1)) >= 25, out
    for name in ("window", "debounce", "client", "settings", "extension"):
        assert f"test/{name}.test.ts" in out, out


def test_vsix_packages_the_compiled_extension(node_modules, tmp_path):
    vsix = tmp_path / "nextok.vsix"
    run("npx", "vsce", "package", "--no-dependencies", "--skip-license", "--allow-missing-repository",
        "-o", str(vsix))
    assert vsix.is_file()
    with zipfile.ZipFile(vsix) as z:
        names = set(z.namelist())
        manifest = json.loads(z.read("extension/package.json"))
        extension_js = z.read("extension/out/extension.js").decode()
    assert {"extension.vsixmanifest", "extension/out/client.js", "extension/out/completer.js"} <= names
    assert manifest["main"] == "./out/extension.js"
    assert "registerInlineCompletionItemProvider" in extension_js
    assert not any(n.startswith(("extension/src/", "extension/test/", "extension/node_modules/")) for n in names)
