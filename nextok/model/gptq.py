"""GPTQ checkpoints (AutoGPTQ's "gptq" format, the one exllama and vLLM read): 4-bit weights
with a scale and a zero point per group of input channels, optionally in activation order.

Per linear `X` (W is [out, in]):
    X.qweight  int32 [in / 8, out]    nibble j (bits 4j..4j+3) of row r holds input channel 8r + j
    X.qzeros   int32 [G, out / 8]     nibble j of column c holds output channel 8c + j; the zero
                                      point minus one (the format's historical offset)
    X.scales   float16 [G, out]
    X.g_idx    int32 [in]             the group of each input channel (optional: i // group_size);
                                      act-order ("desc_act") checkpoints permute it
    W[o, i] = s[g, o] * (q[i, o] - (qzeros[g, o] + 1)),  g = g_idx[i]
config.json: "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": G,
"desc_act": bool, "sym": bool}; group_size -1 is one group per output channel.

`weights()` yields each X.weight dequantized exactly (float32). `blocks()` yields GGUF Q4_1
blocks for the CPU kernels when the groups are contiguous runs of whole 32-blocks (no act-order
permutation); d = s, m = -z * s rounded to float16, as for AWQ (model/awq.py).
"""
from __future__ import annotations

from collections.abc import Iterator

import torch

from nextok.errors import ModelLoadError
from nextok.model.packed_int4 import PARTS, check_layer  # and the optional g_idx
Q4_1 = 3


def check_config(qc: dict) -> int:
    """The quantization_config of a GPTQ checkpoint -> its group size (-1: per channel)."""
    if qc.get("bits") != 4:
        raise ModelLoadError(f"GPTQ checkpoint with bits={qc.get('bits')!r}: only 4-bit GPTQ "
                             f"checkpoints are supported")
    fmt = qc.get("checkpoint_format", "gptq")
    if fmt != "gptq":
        raise ModelLoadError(f"GPTQ checkpoint_format {fmt!r} is not supported (only 'gptq')")
    g = qc.get("group_size", 128)
    if not isinstance(g, int) or not (g == -1 or g >= 1):
        raise ModelLoadError(f"GPTQ group_size must be a positive integer or -1, got {g!r}")
    return g


def unpack_rows(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] -> uint8 [8R, C]: nibble j of row r becomes row 8r + j."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32).view(1, 8, 1)
    return ((packed.unsqueeze(1) >> shifts) & 0xF).reshape(-1, packed.shape[1]).to(torch.uint8)


def unpack_cols(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] -> uint8 [R, 8C]: nibble j of column c becomes column 8c + j."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    return ((packed.unsqueeze(-1) >> shifts) & 0xF).reshape(packed.shape[0], -1).to(torch.uint8)


def pack_rows(values: torch.Tensor) -> torch.Tensor:
    """uint8 [8R, C] in 0..15 -> int32 [R, C] (the qweight packing)."""
    v = values.to(torch.int32).view(-1, 8, values.shape[1])
    shifts = torch.arange(0, 32, 4, dtype=torch.int32).view(1, 8, 1)
    return (v << shifts).sum(dim=1, dtype=torch.int32)


def pack_cols(values: torch.Tensor) -> torch.Tensor:
    """uint8 [R, 8C] in 0..15 -> int32 [R, C] (the qzeros packing)."""
    v = values.to(torch.int32).view(values.shape[0], -1, 8)
    return (v << torch.arange(0, 32, 4, dtype=torch.int32)).sum(dim=-1, dtype=torch.int32)


def _parts(name: str, parts: dict[str, torch.Tensor], group: int):
    """Validated (q [out, in] uint8, z [out, G] uint8 (true zero points), s [out, G] float16,
    g_idx [in] long) of linear `name`."""
    # qweight [in / 8, out]: the nibbles pack input channels
    qw, qz, sc, k, g = check_layer("GPTQ", name, parts, group,
                                   lambda qw: (qw.shape[0] * 8, qw.shape[1]))
    g_idx = parts.get("g_idx")
    if g_idx is None:
        g_idx = torch.arange(k) // g
    elif tuple(g_idx.shape) != (k,) or int(g_idx.min()) < 0 or int(g_idx.max()) >= k // g:
        raise ModelLoadError(f"GPTQ layer {name!r}: g_idx must hold {k} group indices below {k // g}")
    z = (unpack_cols(qz).to(torch.int16) + 1).T.contiguous()  # the stored value is z - 1
    return unpack_rows(qw).T.contiguous(), z, sc.to(torch.float16).T.contiguous(), g_idx.long()


def dequantize(q, z, s, g_idx) -> torch.Tensor:
    """q [out, in], z and s [out, G], g_idx [in] -> W [out, in] float32, exactly s * (q - z)."""
    return (q.float() - z.float()[:, g_idx]) * s.float()[:, g_idx]


def _grouped(tensors: Iterator[tuple[str, torch.Tensor]], group: int):
    """("plain", name, tensor) or ("gptq", X.weight, parts) once X's parts have all been seen.
    g_idx is optional, so a layer is complete at its 3 required parts plus g_idx when the
    checkpoint has g_idx tensors at all (decided from the first layer: all or none)."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in tensors:
        prefix, _, part = name.rpartition(".")
        if part not in PARTS and part != "g_idx":
            yield "plain", name, t
            continue
        parts = pending.setdefault(prefix, {})
        parts[part] = t
        if all(p in parts for p in PARTS) and "g_idx" in parts:
            yield "gptq", prefix + ".weight", _parts(prefix, pending.pop(prefix), group)
    for prefix, parts in pending.items():  # layers without g_idx end here
        yield "gptq", prefix + ".weight", _parts(prefix, parts, group)


def weights(tensors, group: int) -> Iterator[tuple[str, torch.Tensor]]:
    for kind, name, value in _grouped(tensors, group):
        yield name, dequantize(*value) if kind == "gptq" else value


def blocks(tensors, group: int, type_ids: tuple[int, ...]) -> Iterator[tuple[str, int, torch.Tensor]]:
    """(X.weight, Q4_1, raw blocks) per GPTQ linear whose groups are contiguous whole blocks."""
    if Q4_1 not in type_ids:
        return
    from nextok.quant.int4 import zero_point_blocks

    for kind, name, value in _grouped(tensors, group):
        if kind != "gptq":
            continue
        q, z, s, g_idx = value
        k = q.shape[1]
        g = k // s.shape[1]
        if g % 32 or not torch.equal(g_idx, torch.arange(k) // g):
            continue  # act-order or odd groups: this layer stays dense
        yield name, Q4_1, zero_point_blocks(q, z, s)
