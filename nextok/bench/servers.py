"""Server processes for the benchmarks: nextok and llama.cpp's llama-server on one GGUF file.

`ServerUnderTest` starts a server, waits until it answers, and measures the CPU time of its
process tree, so a run can tell its server's work from what other processes took meanwhile.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import psutil

PEER_SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "peer", "build_llama_server.sh")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_llama_server(path: str | None = None) -> str:
    """An explicit path, else the cached `make peer` build, else one on PATH."""
    if path:
        if not os.access(path, os.X_OK):
            raise FileNotFoundError(f"llama-server {path!r} is not an executable file")
        return path
    cache = os.environ.get("NEXTOK_CACHE", os.path.expanduser("~/.cache/nextok"))
    built = os.path.join(cache, "peer", "llama-cpp-python-0.3.36", "bin", "llama-server")
    if os.access(built, os.X_OK):
        return built
    found = shutil.which("llama-server")
    if found:
        return found
    raise FileNotFoundError("llama-server not found: run `make peer` (builds it once, 8-14 min) "
                            "or pass --llama-server PATH")


class ServerUnderTest:
    def __init__(self, name: str, argv: list[str], port: int, ready_path: str, log_path: str):
        self.name, self.argv, self.port, self.ready_path = name, argv, port, ready_path
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    @classmethod
    def nextok(cls, gguf: str, threads: int, parallel: int, log_dir: str, extra: list[str] = (),
               name: str = "nextok"):
        port = free_port()
        argv = [sys.executable, "-m", "nextok", "serve", "--model", gguf, "--host", "127.0.0.1",
                "--port", str(port), "--num-threads", str(threads), "--max-num-seqs", str(parallel),
                *extra]
        return cls(name, argv, port, "/ready", os.path.join(log_dir, f"{name}.log"))

    @classmethod
    def llama_cpp(cls, binary: str, gguf: str, threads: int, parallel: int, ctx_per_slot: int,
                  log_dir: str, extra: list[str] = ()):
        port = free_port()
        argv = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port),
                "-t", str(threads), "-tb", str(threads), "-np", str(parallel),
                "-c", str(parallel * ctx_per_slot), "--metrics", *extra]
        return cls("llama.cpp", argv, port, "/health", os.path.join(log_dir, "llama-server.log"))

    def start(self, timeout: float = 300.0) -> "ServerUnderTest":
        import httpx

        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} while starting; "
                                   f"see {self.log_path}")
            try:
                if httpx.get(self.url + self.ready_path, timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"{self.name} was not ready within {timeout:.0f} s; see {self.log_path}")

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server and its children so far."""
        try:
            return tree_cpu_seconds(psutil.Process(self.proc.pid))
        except (psutil.NoSuchProcess, AttributeError):
            return 0.0

    def rss_bytes(self) -> int:
        try:
            root = psutil.Process(self.proc.pid)
            return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
        except (psutil.NoSuchProcess, AttributeError):
            return 0

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


def tree_cpu_seconds(root: psutil.Process) -> float:
    """User + system CPU seconds of a process and its children so far (children that end meanwhile
    are skipped). Raises psutil.NoSuchProcess when the root itself is gone."""
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            if p is root:
                raise
    return total


class CpuAccount:
    """CPU seconds spent over a `with` block: this client's, each named process's (a reader
    returning its CPU seconds so far), all other processes' (the machine's busy time minus those)
    and the hypervisor's steal. A shared machine's slow periods must show in a result.

        with CpuAccount(server=srv.cpu_seconds) as cpu: ...
        cpu.summary() -> {"client_cpu_s", "server_cpu_s", "other_processes_cpu_s", "steal_s"}
    """

    def __init__(self, **readers):
        self.readers = readers

    def __enter__(self):
        self._busy0, self._steal0 = machine_cpu_seconds()
        self._own0 = own_cpu_seconds()
        self._procs0 = {name: read() for name, read in self.readers.items()}
        return self

    def __exit__(self, *exc):
        busy1, steal1 = machine_cpu_seconds()
        self.client = own_cpu_seconds() - self._own0
        self.procs = {name: read() - self._procs0[name] for name, read in self.readers.items()}
        self.steal = steal1 - self._steal0
        self.other = max(0.0, (busy1 - self._busy0) - self.client - sum(self.procs.values()))
        return False

    def summary(self) -> dict:
        return {"client_cpu_s": round(self.client, 2),
                **{f"{name}_cpu_s": round(v, 2) for name, v in self.procs.items()},
                "other_processes_cpu_s": round(self.other, 2), "steal_s": round(self.steal, 2)}


def machine_cpu_seconds() -> tuple[float, float]:
    """(CPU seconds all processes of this machine have used, steal seconds) from /proc/stat.

    Steal is time the hypervisor gave our virtual CPUs to someone else: a slow period of the host
    shows there when it shows anywhere.
    """
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]] + [0] * 10
    user, nice, system, _idle, _iowait, irq, softirq, steal = v[:8]  # guest is inside user
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / hz, steal / hz


def own_cpu_seconds() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system
