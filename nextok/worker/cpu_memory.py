"""CPU memory the OS commits as it is used."""
from __future__ import annotations

import mmap

import torch


def lazy_zeros(shape, dtype: torch.dtype, device=None) -> torch.Tensor:
    """A zeroed CPU tensor whose memory the OS commits page by page as it is first written: an
    anonymous mapping, which Linux fills with zeros on first touch. Why: the CPU KV pool is
    sized up front (up to 4 GiB), and torch.zeros writes every page of it at start, so the
    default model's engine held 5.3 GB resident before serving a token; this way it holds what
    its sequences have written. Reads of untouched pages see zeros without committing them.
    (device: torch.zeros' argument, for a caller that picks either; always the CPU here.)"""
    numel = 1
    for n in shape:
        numel *= n
    if numel == 0:
        return torch.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, numel * dtype.itemsize)  # private, anonymous, zero-filled; the tensor
    return torch.frombuffer(buf, dtype=dtype, count=numel).view(shape)  # holds it (and its views)
