"""An installed nextok (`pip install .`, the Docker image) has every file the package reads at run
time: the wheel carries what pyproject's package-data lists, so each such file must match a
pattern there (the C kernels' headers once did not, and every kernel that includes one failed
to build in the image)."""
from __future__ import annotations

import fnmatch
import os
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.join(ROOT, "nextok")


def _patterns() -> list[str]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-data"]["nextok"]


def _run_time_files() -> list[str]:
    """Files under nextok/ that are not Python modules: C kernel sources and headers, tile
    tables, the playground page."""
    found = []
    for folder, dirs, names in os.walk(PKG):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in names:
            if not name.endswith((".py", ".pyc")) and not name.startswith("."):
                found.append(os.path.relpath(os.path.join(folder, name), PKG).replace(os.sep, "/"))
    return sorted(found)


def test_every_run_time_file_is_package_data():
    files = _run_time_files()
    assert any(f.endswith(".h") for f in files) and any(f.endswith(".c") for f in files)
    patterns = _patterns()
    missing = [f for f in files if not any(fnmatch.fnmatch(f, p) for p in patterns)]
    assert not missing, f"not in [tool.setuptools.package-data] of pyproject.toml: {missing}"


def test_every_include_is_shipped():
    """Each header a kernel source includes with quotes is a file beside it (so cpu_build's
    compile, which runs in that folder's copy, finds it)."""
    import re

    csrc = os.path.join(PKG, "kernels", "csrc")
    for name in os.listdir(csrc):
        if name.endswith((".c", ".h")):
            with open(os.path.join(csrc, name)) as f:
                for header in re.findall(r'#include\s+"([^"]+)"', f.read()):
                    assert os.path.exists(os.path.join(csrc, header)), f"{name} includes missing {header}"
