"""The `nextok` command line, run as a real subprocess (the installed console script)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

NEXTOK = os.path.join(os.path.dirname(sys.executable), "nextok")


def run(*args, timeout=300, **env):
    proc = subprocess.run([NEXTOK, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})
    return proc.returncode, proc.stdout, proc.stderr


def test_help_lists_every_command():
    rc, out, _ = run("--help")
    assert rc == 0
    for cmd in ("generate", "pull", "bench"):
        assert cmd in out
    rc, out, _ = run("bench", "throughput", "--help")
    assert rc == 0 and "--baseline" in out and "--num-prompts" in out


def test_version():
    from nextok import __version__

    rc, out, _ = run("--version")
    assert rc == 0 and out.strip() == f"nextok {__version__}"


def test_generate_streams_the_greedy_completion(llm_f32, model_path):
    from nextok import SamplingParams

    prompt = "def fibonacci(n):"
    ref = llm_f32.generate(prompt, SamplingParams(temperature=0.0, max_tokens=24))[0]
    rc, out, err = run("generate", prompt, "--max-tokens", "24", "--model", model_path,
                       "--dtype", "float32", "--kv-cache-memory", "64MiB")
    assert rc == 0, err
    assert out == prompt + ref.outputs[0].text + "\n"


def test_pull_prints_the_cached_path(model_path):
    rc, out, _ = run("pull")
    assert rc == 0 and out.strip() == model_path


@pytest.mark.parametrize("args, message", [
    (["generate", "hi", "--model", "/nonexistent/model.gguf"], "nonexistent"),
    (["generate", "hi", "--model", "no-such-alias"], "no-such-alias"),
    (["generate", "hi", "--max-tokens", "0"], "max_tokens"),
    (["generate", "hi", "--temperature", "-1"], "temperature"),
    (["generate", "hi", "--block-size", "3"], "block-size"),
    (["generate", "hi", "--dtype", "int3"], "dtype"),
    (["pull", "no-such-model"], "no-such-model"),
])
def test_errors_are_one_line_and_nonzero(args, message):
    rc, out, err = run(*args)
    assert rc != 0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], err
    assert "Traceback" not in err


def test_garbage_model_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"\0" * 1000)
    rc, _, err = run("generate", "hi", "--model", str(bad))
    assert rc != 0 and "Traceback" not in err and err.startswith("error:")
