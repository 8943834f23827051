"""HAProxy in front of nextok replicas on loopback: the config of deploy/haproxy, rendered for the
ports at hand, a running haproxy process, and its runtime state read from the stats socket.

    with HAProxy([8001, 8002], log_dir) as lb:   # lb.url balances over both
        lb.server_status("r1")                   # "UP", "DOWN", "MAINT", ...
"""
from __future__ import annotations

import csv
import io
import os
import re
import shutil
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from nextok.bench.servers import ServerUnderTest, free_port

CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "haproxy", "haproxy.cfg")
_SERVER_LINE = re.compile(r"^(\s+)server r\d+ 127\.0\.0\.1:\d+(.*)$")


def find_haproxy() -> str | None:
    return shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if os.access(p, os.X_OK)), None)


def render_config(ports: list[int], port: int, stats_socket: str, stats_port: int,
                  template: str = CONFIG) -> str:
    """deploy/haproxy/haproxy.cfg with replicas r1..rN on `ports`, the frontend on `port`."""
    with open(template) as f:
        lines = f.read().splitlines()
    out: list[str] = []
    for line in lines:
        m = _SERVER_LINE.match(line)
        if m:
            if out and _SERVER_LINE.match(out[-1]):
                continue  # the block of server lines was written at its first line
            out += [f"{m.group(1)}server r{i} 127.0.0.1:{p}{m.group(2)}" for i, p in enumerate(ports, 1)]
            continue
        line = line.replace("bind 127.0.0.1:8000", f"bind 127.0.0.1:{port}")
        line = line.replace("bind 127.0.0.1:8404", f"bind 127.0.0.1:{stats_port}")
        line = line.replace("/tmp/nextok-haproxy.sock", stats_socket)
        out.append(line)
    return "\n".join(out) + "\n"


class HAProxy:
    """A haproxy process (foreground, `-db`) balancing over `ports`; a context manager."""

    def __init__(self, ports: list[int], log_dir: str, binary: str | None = None):
        self.binary = binary or find_haproxy()
        if self.binary is None:
            raise FileNotFoundError("haproxy is not installed (apt-get install haproxy; make system-deps)")
        self.port, self.stats_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.socket = os.path.join(log_dir, f"haproxy-{self.port}.sock")
        self.config = os.path.join(log_dir, f"haproxy-{self.port}.cfg")
        with open(self.config, "w") as f:
            f.write(render_config(ports, self.port, self.socket, self.stats_port))
        self.log_path = os.path.join(log_dir, f"haproxy-{self.port}.log")
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> "HAProxy":
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([self.binary, "-db", "-f", self.config], stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.proc.returncode}; see {self.log_path}")
            try:
                self.stat()
                return self
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"haproxy did not open its stats socket; see {self.log_path}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None:
            self._log.close()

    def __enter__(self) -> "HAProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def command(self, cmd: str) -> str:
        """One runtime API command on the stats socket (`show stat`, `show servers state`...)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(self.socket)
            s.sendall(cmd.encode() + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def stat(self) -> list[dict]:
        """`show stat` as rows: pxname, svname, status, scur, stot, wretr, wredis, ..."""
        text = self.command("show stat").lstrip("# ")
        return [row for row in csv.DictReader(io.StringIO(text)) if row.get("pxname")]

    def server_status(self, server: str, backend: str = "pool") -> str:
        for row in self.stat():
            if row["pxname"] == backend and row["svname"] == server:
                return row["status"].split()[0]  # "UP", "DOWN", "UP 1/2" (going down), "NOLB"...
        raise KeyError(f"{backend}/{server}")

    def wait_status(self, server: str, status: str, timeout: float, backend: str = "pool") -> float:
        """Seconds until `server` shows `status` (polled every 50 ms); TimeoutError past `timeout`."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.server_status(server, backend) == status:
                return time.monotonic() - t0
            time.sleep(0.05)
        raise TimeoutError(f"{backend}/{server} not {status} after {timeout:.1f} s "
                           f"(now {self.server_status(server, backend)})")

    def backend_counter(self, field: str, backend: str = "pool") -> int:
        """A backend total such as `wretr` (retries) or `wredis` (redispatches)."""
        for row in self.stat():
            if row["pxname"] == backend and row["svname"] == "BACKEND":
                return int(row[field] or 0)
        raise KeyError(backend)


def start_replicas(gguf: str, n: int, log_dir: str, threads: int, extra: list[str] = ()) -> list[ServerUnderTest]:
    """n `nextok serve` processes, started together (model loads overlap), each waited for."""
    replicas = [ServerUnderTest.nextok(gguf, threads, 16, log_dir, list(extra), name=f"r{i}")
                for i in range(1, n + 1)]
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(lambda r: r.start(), replicas))
    return replicas
