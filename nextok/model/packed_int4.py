"""What AWQ and GPTQ checkpoints share: each linear is a qweight, qzeros and scales triple, with
scales [in / G, out] and qzeros [in / G, out / 8] whatever way qweight packs its nibbles."""
from __future__ import annotations

from collections.abc import Callable

import torch

from nextok.errors import ModelLoadError

PARTS = ("qweight", "qzeros", "scales")


def check_layer(fmt: str, name: str, parts: dict[str, torch.Tensor], group: int,
                shape: Callable[[torch.Tensor], tuple[int, int]]):
    """(qweight, qzeros, scales, in_features, group size) of linear `name` once they agree with
    each other and with `group` (-1: one group per row), or ModelLoadError naming what is wrong.
    shape(qweight) -> (in_features, out_features), as the format packs them."""
    missing = [p for p in PARTS if p not in parts]
    if missing:
        raise ModelLoadError(f"{fmt} layer {name!r} lacks {', '.join(name + '.' + p for p in missing)}")
    qw, qz, sc = (parts[p] for p in PARTS)
    if qw.dtype != torch.int32 or qz.dtype != torch.int32:
        raise ModelLoadError(f"{fmt} layer {name!r}: qweight and qzeros must be int32, got "
                             f"{qw.dtype} and {qz.dtype}")
    k, out = shape(qw)
    g = k if group == -1 else group
    if k % g:
        raise ModelLoadError(f"{fmt} layer {name!r}: {k} input channels are not a multiple of "
                             f"group_size {group}")
    if tuple(sc.shape) != (k // g, out) or tuple(qz.shape) != (k // g, out // 8):
        raise ModelLoadError(
            f"{fmt} layer {name!r} does not match group_size {group}: qweight {tuple(qw.shape)} "
            f"needs scales {(k // g, out)} and qzeros {(k // g, out // 8)}, got "
            f"{tuple(sc.shape)} and {tuple(qz.shape)}")
    return qw, qz, sc, k, g
