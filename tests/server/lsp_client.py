"""A small LSP client over stdio for the tests: JSON-RPC frames (Content-Length headers) written
to a `nextok lsp` process, responses and notifications read back on a thread."""
from __future__ import annotations

import itertools
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time

from tests.server.conftest import REPO


class LspProcess:
    def __init__(self, *args: str, env: dict | None = None):
        self._stderr = tempfile.TemporaryFile()  # a file, not a pipe: a full pipe would block it
        self.proc = subprocess.Popen([sys.executable, "-m", "nextok", "lsp", *args], cwd=REPO,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     env={**os.environ, **(env or {})})
        self._ids = itertools.count(1)
        self._responses: dict[int, queue.Queue] = {}
        self._lock = threading.Lock()
        self.notifications: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        out = self.proc.stdout
        while True:
            length = None
            while (line := out.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            if not line or length is None:
                return  # EOF: the server exited
            msg = json.loads(out.read(length))
            if "id" in msg and "method" not in msg:
                self._queue(msg["id"]).put(msg)
            elif "id" in msg:  # a server -> client request: answer it empty
                self._send({"jsonrpc": "2.0", "id": msg["id"], "result": None})
            else:
                self.notifications.put(msg)

    def _queue(self, msg_id: int) -> queue.Queue:
        with self._lock:
            return self._responses.setdefault(msg_id, queue.Queue())

    def _send(self, msg: dict) -> None:
        data = json.dumps(msg).encode()
        with self._lock:
            self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(data) + data)
            self.proc.stdin.flush()

    def request(self, method: str, params) -> int:
        msg_id = next(self._ids)
        self._queue(msg_id)
        self._send({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
        return msg_id

    def notify(self, method: str, params) -> None:
        self._send({"jsonrpc": "2.0", "method": method, "params": params})

    def response(self, msg_id: int, timeout: float = 120.0) -> dict:
        return self._queue(msg_id).get(timeout=timeout)

    def call(self, method: str, params, timeout: float = 120.0) -> dict:
        return self.response(self.request(method, params), timeout)

    def notification(self, method: str, timeout: float = 10.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            msg = self.notifications.get(timeout=max(0.01, deadline - time.monotonic()))
            if msg["method"] == method:
                return msg

    def initialize(self, root: str = REPO) -> dict:
        caps = {"textDocument": {"inlineCompletion": {}, "completion": {}, "synchronization": {}}}
        r = self.call("initialize", {"processId": os.getpid(), "rootUri": f"file://{root}",
                                     "capabilities": caps}, timeout=60)
        self.notify("initialized", {})
        return r

    def open(self, uri: str, text: str, language: str = "python") -> None:
        self.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": language,
                                                              "version": 1, "text": text}})

    def close(self, timeout: float = 10.0) -> int:
        """shutdown + exit, as an editor ends the session; the exit code."""
        if self.proc.poll() is None:
            try:
                self.call("shutdown", None, timeout=timeout)
                self.notify("exit", None)
                self.proc.wait(timeout)
            except (queue.Empty, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")
