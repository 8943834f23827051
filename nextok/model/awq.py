"""AWQ checkpoints (AutoAWQ's "gemm" layout), read as what they define: 4-bit weights with a
scale and a zero point per group of input channels.

Per linear `X` (W is [out, in]; G = group_size, in % G == 0):
    X.qweight  int32 [in, out / 8]   8 nibbles per int32: nibble i (bits 4i..4i+3) of column c
                                      holds output channel 8c + ORDER[i]
    X.qzeros   int32 [in / G, out / 8] the zero points, packed the same way
    X.scales   float16 [in / G, out]
    W[o, i] = (q[i, o] - z[i // G, o]) * s[i // G, o]
config.json: "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": G,
"zero_point": true, "version": "gemm"}.

`weights()` yields each X.weight dequantized (float32, exact: a 5-bit integer times a float16
scale). `blocks()` yields the same weights as GGUF Q4_1 blocks (d = s, m = -z * s rounded to
float16; w = d * q + m) for the CPU block kernels, when G is a multiple of 32: they differ from
the exact weights only by the rounding of m, at most |z * s| * 2^-11.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch

from nextok.errors import ModelLoadError
from nextok.model.packed_int4 import PARTS, check_layer

ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble i of a packed int32 -> output channel 8c + ORDER[i]
Q4_1 = 3


def check_config(qc: dict) -> int:
    """The quantization_config of an AWQ checkpoint -> its group size, or ModelLoadError."""
    bad = {k: qc.get(k) for k, want in (("bits", 4), ("version", "gemm"), ("zero_point", True))
           if str(qc.get(k, want)).lower() != str(want).lower()}
    if bad:
        raise ModelLoadError(f"AWQ checkpoint with {bad}: only 4-bit, zero-point, 'gemm' AWQ "
                             f"checkpoints are supported")
    g = qc.get("group_size")
    if not isinstance(g, int) or g < 1:
        raise ModelLoadError(f"AWQ group_size must be a positive integer, got {g!r}")
    return g


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C / 8] -> uint8 [R, C], undoing AWQ's column order."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    nibbles = (packed.unsqueeze(-1) >> shifts) & 0xF  # [R, C/8, 8]; [..., i] = channel ORDER[i]
    out = torch.empty_like(nibbles)
    out[..., ORDER] = nibbles
    return out.reshape(packed.shape[0], -1).to(torch.uint8)


def pack(values: torch.Tensor) -> torch.Tensor:
    """uint8 [R, C] in 0..15 -> int32 [R, C / 8] in AWQ's order (what AutoAWQ writes)."""
    v = values.to(torch.int32).reshape(values.shape[0], -1, 8)[..., ORDER]  # [..., i] = ORDER[i]
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    return (v << shifts).sum(dim=-1, dtype=torch.int32)


def _parts(name: str, parts: dict[str, torch.Tensor], group: int) -> tuple[torch.Tensor, ...]:
    """Validated (q [out, in] uint8, z [out, G] uint8, s [out, G] float16) of linear `name`."""
    # qweight [in, out / 8]: the nibbles pack output channels
    qw, qz, sc, _, _ = check_layer("AWQ", name, parts, group,
                                   lambda qw: (qw.shape[0], qw.shape[1] * 8))
    return unpack(qw).T.contiguous(), unpack(qz).T.contiguous(), sc.to(torch.float16).T.contiguous()


def dequantize(q: torch.Tensor, z: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """q [out, in], z and s [out, G] -> W [out, in] float32, exactly (q - z) * s."""
    out, k = q.shape
    g = k // s.shape[1]
    w = (q.float().view(out, -1, g) - z.float().unsqueeze(2)) * s.float().unsqueeze(2)
    return w.view(out, k)


def _grouped(tensors: Iterator[tuple[str, torch.Tensor]], group: int):
    """Checkpoint tensors -> ("plain", name, tensor) or ("awq", X.weight, (q, z, s)) once all three
    parts of linear X have been seen (they may come in any order, from any shard)."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in tensors:
        prefix, _, part = name.rpartition(".")
        if part not in PARTS:
            yield "plain", name, t
            continue
        parts = pending.setdefault(prefix, {})
        parts[part] = t
        if len(parts) == len(PARTS):
            yield "awq", prefix + ".weight", _parts(prefix, pending.pop(prefix), group)
    for prefix, parts in pending.items():
        _parts(prefix, parts, group)  # raises: a part is missing


def weights(tensors: Iterator[tuple[str, torch.Tensor]], group: int) -> Iterator[tuple[str, torch.Tensor]]:
    for kind, name, value in _grouped(tensors, group):
        yield name, dequantize(*value) if kind == "awq" else value


def blocks(tensors: Iterator[tuple[str, torch.Tensor]], group: int,
           type_ids: tuple[int, ...]) -> Iterator[tuple[str, int, torch.Tensor]]:
    """(X.weight, Q4_1, raw blocks [out, in / 32 * 20]) per AWQ linear, if the kernels take Q4_1
    and the groups are whole blocks."""
    if Q4_1 not in type_ids or group % 32:
        return
    from nextok.quant.int4 import zero_point_blocks

    for kind, name, value in _grouped(tensors, group):
        if kind == "awq":
            yield name, Q4_1, zero_point_blocks(*value)
