"""Programmatic dependent launch (PDL, Hopper and newer): a kernel may start while the one before
it on the stream is still finishing, and waits (`griddepcontrol.wait`) only where it first reads
that kernel's output.

Why: a batch-1 decode step of an 8B model is ~300 launches, and each boundary between two kernels
costs the tail of the first (its last CTAs finishing while SMs idle) plus the start of the next
(its CTAs being scheduled, their first loads in flight). With PDL the next kernel's CTAs are
already resident, and a GEMV can issue its first weight loads, which depend on nothing, before
it waits for its input.

The contract every kernel launched with `launch_pdl=True` keeps: it calls `pdl_wait(PDL)` before
it reads anything an earlier kernel wrote and before it writes anything, and nothing before the
wait reads other than constants (weights). Kernels not launched with PDL (cuBLAS, torch's own)
are ordered as usual, so mixing them is safe.

On by default on GPUs of compute capability 9.0 and newer; NEXTOK_PDL=0 turns it off. Never in
Triton's interpreter (the instructions are PTX inline assembly).
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

_OVERRIDE: bool | None = None  # set_enabled(): benchmarks switch it between graph captures
_ENV_ON = os.environ.get("NEXTOK_PDL", "1") != "0"  # read once, at import


@functools.cache
def _supported(index: int) -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return torch.cuda.get_device_capability(index) >= (9, 0)


def enabled(device: torch.device) -> bool:
    """Launch with PDL on this device? Decided per launch (cheap), so captures pick it up."""
    if device.type != "cuda":
        return False
    if _OVERRIDE is not None:
        return _OVERRIDE and _supported(device.index or 0)
    return _ENV_ON and _supported(device.index or 0)


def set_enabled(value: bool | None) -> None:
    """Force PDL on or off for launches from now on (None: back to the default)."""
    global _OVERRIDE
    _OVERRIDE = value


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait for the previous kernel's writes, then let the next kernel's CTAs launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
