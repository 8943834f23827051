"""What every benchmark result carries: machine, commit, command; and the meters it uses.

- `Meter` samples this process's RSS in a background thread (peak memory of a phase) and
  reads, from /proc/stat, how much CPU time *other* processes took during the phase: these
  machines are shared, and a slow period must be visible in the result, not hidden in it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time


def git_commit() -> dict:
    """The commit benchmarked. NEXTOK_COMMIT overrides it, for a copy of the tree whose .git is
    not the source's (the GPU machine gets the working tree with a stale repository)."""
    if os.environ.get("NEXTOK_COMMIT"):
        return {"commit": os.environ["NEXTOK_COMMIT"], "dirty": False}

    def run(*cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10,
                                  cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    return {"commit": run("git", "rev-parse", "HEAD") or "unknown",
            "dirty": bool(run("git", "status", "--porcelain", "--untracked-files=no"))}


def header(extra: dict | None = None) -> dict:
    from nextok import __version__, platform

    return {
        "nextok_version": __version__,
        **git_commit(),
        "command": _command_line(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": platform.describe_machine(),
        **(extra or {}),
    }


def _command_line() -> str:
    """How this run was started, as a user would type it (`python -m nextok` counts as nextok)."""
    prog = sys.argv[0]
    if prog.endswith("nextok") or prog.endswith(os.path.join("nextok", "__main__.py")):
        return " ".join(["nextok", *sys.argv[1:]])
    return " ".join([os.path.basename(prog), *sys.argv[1:]])


def _cpu_jiffies() -> tuple[int, int]:
    """(busy jiffies of the whole machine, jiffies of this process incl. children threads)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # minus idle, iowait
    with open(f"/proc/{os.getpid()}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    own = int(parts[11]) + int(parts[12])  # utime + stime
    return busy, own


class Meter:
    """with Meter() as m: ...; then m.seconds, m.peak_rss, m.other_cpu_seconds."""

    def __init__(self, interval: float = 0.02):
        import psutil

        self._proc = psutil.Process()
        self._interval = interval
        self._stop = threading.Event()
        self.peak_rss = 0

    def _sample(self) -> None:
        while not self._stop.wait(self._interval):
            self.peak_rss = max(self.peak_rss, self._proc.memory_info().rss)

    def __enter__(self):
        self.peak_rss = self._proc.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        self._busy0, self._own0 = _cpu_jiffies()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self._t0
        busy1, own1 = _cpu_jiffies()
        self._stop.set()
        self._thread.join()
        self.peak_rss = max(self.peak_rss, self._proc.memory_info().rss)
        hz = os.sysconf("SC_CLK_TCK")
        self.other_cpu_seconds = max(0, (busy1 - self._busy0) - (own1 - self._own0)) / hz
        self.own_cpu_seconds = (own1 - self._own0) / hz
        return False

    def summary(self) -> dict:
        return {"seconds": round(self.seconds, 4), "peak_rss_mib": round(self.peak_rss / 2**20, 1),
                "own_cpu_seconds": round(self.own_cpu_seconds, 2),
                "other_processes_cpu_seconds": round(self.other_cpu_seconds, 2)}


def memory_copy_gbps(mib: int = 64, repeats: int = 5) -> float:
    """This machine's memory copy bandwidth now, GB/s (best of a few 64 MiB copies, ~0.1 s).
    Other virtual machines on a shared host take bandwidth that no process list here shows; a
    batch-1 decode step streams its weights, so it slows with them while a step of many rows,
    which reads the same weights once for all, slows less: a ratio between the two moves."""
    import numpy as np

    src = np.ones(mib * 2**20 // 8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return 2 * src.nbytes / best / 1e9  # read + write


def memory_report(engine) -> dict:
    """How the engine holds its weights and cache, and this process's peak memory so far: the
    way each quantization method and KV cache dtype is compared on memory (run one per process,
    since the peaks are the process's)."""
    import resource

    import torch

    from nextok.bench.latency import weight_bytes

    cfg = engine.config
    out = {"quantization": cfg.quantization, "kv_cache_dtype": cfg.cache.kv_cache_dtype,
           "weight_bytes": weight_bytes(engine.runner.model, decode=False),
           "kv_cache_bytes": sum(t.numel() * t.element_size() for kv in engine.runner.kv_caches for t in kv),
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # KiB on Linux
    if cfg.device == "cuda":
        out["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def write_json(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")


def machine_line(m: dict) -> str:
    """One line for a results table: CPU, its vector extensions, memory, torch, GPU."""
    flags = m.get("cpu_flags") or {}
    isa = ", ".join(k.upper() for k, v in flags.items() if v) or "no AVX2"
    gpu = f", GPU {m['cuda_device']}" if m.get("cuda_device") else ""
    return (f"{m.get('cpu_model', '?')} x{m.get('cpu_count', '?')} CPUs ({isa}), "
            f"{m.get('memory_total_bytes', 0) / 2**30:.1f} GiB, {m.get('os', '?')}, "
            f"Python {m.get('python', '?')}, torch {m.get('torch_version', '?')}{gpu}")
