"""Real `nextok serve` processes on free ports, started once per session, and clients for them."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAIN_KEY = "sk-test-main"
LIMITED_KEY = "sk-test-limited"  # rpm=3: the rate-limit test exhausts it alone
TPM_KEY = "sk-test-tpm"  # tpm=200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python -m nextok serve ...` on a free port; logs go to a file the test can read."""

    def __init__(self, args: list[str], log_path: str, model_path: str, port: int | None = None,
                 entry: tuple[str, ...] = ("nextok",)):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.cmd = [sys.executable, "-m", *entry, "serve", "--model", model_path, "--host", "127.0.0.1",
                    "--port", str(self.port), "--served-model-name", "smollm2-135m-instruct", "--dtype", "float32", "--kv-cache-memory", "256MiB", *args]
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=REPO)

    def wait_ready(self, timeout: float = 180.0) -> "ServerProcess":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready after {timeout}s:\n{self.logs()}")

    def logs(self) -> str:
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


@pytest.fixture(scope="session")
def key_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("keys") / "keys.txt"
    path.write_text(f"# test keys\n{MAIN_KEY} name=main\n{LIMITED_KEY} name=limited rpm=3\n"
                    f"{TPM_KEY} name=tpm tpm=200\n")
    return str(path)


@pytest.fixture(scope="session")
def server(model_path, key_file, tmp_path_factory):
    """The main server: float32, API keys on, default limits."""
    log = str(tmp_path_factory.mktemp("server") / "server.log")
    proc = ServerProcess(["--api-key-file", key_file, "--log-format", "json"], log, model_path)
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key=MAIN_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def async_client(server):
    openai = pytest.importorskip("openai")
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=MAIN_KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="session")
def http(server):
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {MAIN_KEY}"},
                      timeout=120) as c:
        yield c


def metric_value(text: str, name: str, **labels) -> float:
    """Sum of the samples of `name` whose labels include `labels` in Prometheus text output."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, lbl = head.partition("{")
        if metric != name:
            continue
        if all(f'{k}="{v}"' in lbl for k, v in labels.items()):
            total += float(value)
    return total
