"""GPTQ (Frantar et al., 2022): 4-bit weights chosen column by column, each column's rounding
error pushed onto the columns not yet quantized, weighted by the inverse Hessian of the layer's
inputs, H = X^T X over calibration tokens. Round-to-nearest (RTN) is the same quantizer with no
error feedback: the baseline GPTQ must beat at the same group size.

Quantizer (as AutoGPTQ's, asymmetric): per output row and group of `group` input columns,
lo = min(w, 0), hi = max(w, 0), s = (hi - lo) / 15 rounded to float16, z = round(-lo / s) in
[1, 15] (the GPTQ format stores z - 1, so 0 has no stored form), q = clamp(round(w / s) + z, 0,
15), w ~ s * (q - z). For GPTQ the group's (s, z) are taken when its first column is reached, from
the weights as updated by the error feedback so far.
"""
from __future__ import annotations

import torch


def group_params(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, g] -> (s float16 [out], z [out] float in 1..15)."""
    lo = w.amin(dim=1).clamp(max=0)
    hi = w.amax(dim=1).clamp(min=0)
    s = ((hi - lo) / 15).to(torch.float16)
    s = torch.where(s > 0, s, torch.ones_like(s))  # an all-zero group: any scale, q = z
    z = torch.round(-lo / s.float()).clamp(1, 15)
    return s, z


def quantize(weight: torch.Tensor, group: int, hessian: torch.Tensor | None = None,
             damp: float = 0.01) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [out, in] -> (q uint8 [out, in], s float16 [out, G], z uint8 [out, G]).
    hessian [in, in] (X^T X of the layer's inputs): GPTQ; None: round-to-nearest."""
    w = weight.detach().float().clone()
    out, k = w.shape
    ng = k // group
    q = torch.empty(out, k, dtype=torch.uint8)
    s_all = torch.empty(out, ng, dtype=torch.float16)
    z_all = torch.empty(out, ng)
    u = None
    if hessian is not None:
        h = hessian.double().clone()
        dead = torch.diagonal(h) == 0  # inputs never seen: their weights cannot matter
        h[dead, dead] = 1.0
        w[:, dead] = 0.0
        h += damp * torch.diagonal(h).mean() * torch.eye(k, dtype=torch.float64)
        # U: the upper Cholesky factor of H^-1; row i gives column i's error weights.
        u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True).float()
    for i in range(k):
        g = i // group
        if i % group == 0:
            s_all[:, g], z_all[:, g] = group_params(w[:, i:i + group])
        s, z = s_all[:, g].float(), z_all[:, g]
        col = w[:, i]
        qi = torch.clamp(torch.round(col / s) + z, 0, 15)
        q[:, i] = qi.to(torch.uint8)
        if u is not None and i + 1 < k:
            err = (col - s * (qi - z)) / u[i, i]
            w[:, i + 1:] -= err.unsqueeze(1) * u[i, i + 1:].unsqueeze(0)
    return q, s_all, z_all.to(torch.uint8)
