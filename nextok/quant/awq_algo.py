"""AWQ (Lin et al., 2023): activation-aware 4-bit weights. A few input channels carry much larger
activations than the rest; their weights matter more. AWQ scales those weight columns up before
rounding (so they round more finely) and divides the op that produces the input by the same
scales, which leaves the float model's function unchanged. Then it shrinks each group's range
where clipping outliers lowers the output error.

Per decoder layer, a scale vector s [in] for each input a preceding op can absorb:
- input_layernorm -> qkv_proj:      norm weight / s, qkv columns * s;
- post_attention_layernorm -> gate_up_proj;
- up rows of gate_up -> down_proj:  down's input is silu(gate) * up, linear in up's rows;
- v rows of qkv -> o_proj, only without GQA (a query head's channel must map to one v channel).
s = mean|x|^alpha (normalised to a geometric mean of 1), alpha on a grid in [0, 1), chosen to
minimise || x W^T - (x / s) Q(W * s)^T ||^2 on calibration inputs x, Q the round-to-nearest
quantizer below. Clipping: per output row and group, the range max |w| * r, r on a grid in
[0.5, 1], chosen to minimise that group's output error (not for q and k, whose errors go
through the softmax: AutoAWQ leaves them too).

Quantizer (AutoAWQ's, asymmetric): per output row and group, s = max(hi - lo, 1e-5) / 15 with
lo, hi the group's min and max, z = clamp(-round(lo / s), 0, 15), q = clamp(round(w / s) + z, 0,
15), w ~ (q - z) * s. The scale is kept in float16, as the checkpoint stores it.
"""
from __future__ import annotations

import torch

ALPHAS = [i / 20 for i in range(20)]
CLIP_RATIOS = [1.0 - i / 20 for i in range(11)]  # 1.0 .. 0.5


def group_params(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., G] -> (s float16 [...], z float [...] in 0..15)."""
    lo, hi = w.amin(dim=-1), w.amax(dim=-1)
    s = ((hi - lo).clamp(min=1e-5) / 15).to(torch.float16)
    z = (-torch.round(lo / s.float())).clamp(0, 15)
    return s, z


def quantize(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [out, in] -> (q uint8 [out, in], s float16 [out, in / group], z uint8 [out, in / group])."""
    out, k = w.shape
    wg = w.detach().float().reshape(out, k // group, group)
    s, z = group_params(wg)
    q = torch.clamp(torch.round(wg / s.float().unsqueeze(-1)) + z.unsqueeze(-1), 0, 15)
    return q.reshape(out, k).to(torch.uint8), s, z.to(torch.uint8)


def fake_quantize(w: torch.Tensor, group: int) -> torch.Tensor:
    """What the checkpoint will hold for w [out, in], dequantized (float32)."""
    q, s, z = quantize(w, group)
    out, k = w.shape
    deq = (q.float().reshape(out, -1, group) - z.float().unsqueeze(-1)) * s.float().unsqueeze(-1)
    return deq.reshape(out, k)


def search_scale(x: torch.Tensor, act_mean: torch.Tensor, weights: list[torch.Tensor],
                 group: int) -> torch.Tensor:
    """The scales s [in] for the linears `weights` (each [out_i, in]) that share input x [n, in];
    act_mean [in]: mean |x| over all calibration tokens. Returns ones if no alpha beats 0."""
    w = torch.cat([t.detach().float() for t in weights])
    ref = x @ w.T
    best, best_s = None, torch.ones_like(act_mean)
    for alpha in ALPHAS:
        s = act_mean.clamp(min=1e-4).pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        err = (ref - (x / s) @ fake_quantize(w * s, group).T).pow(2).mean().item()
        if best is None or err < best:
            best, best_s = err, s
    return best_s


def search_clip(x: torch.Tensor, w: torch.Tensor, group: int, chunk: int = 256) -> torch.Tensor:
    """w [out, in] with each (row, group) clamped to +-max|w| * r, r chosen per (row, group) to
    minimise that group's contribution error on x [n, in]."""
    out, k = w.shape
    ng = k // group
    xg = x.float().reshape(x.shape[0], ng, group)  # [n, ng, G]
    result = w.detach().float().clone()
    for r0 in range(0, out, chunk):  # rows in chunks: the error tensor is [n, rows, ng]
        wg = result[r0:r0 + chunk].reshape(-1, ng, group)  # [rows, ng, G]
        ref = torch.einsum("ngk,rgk->nrg", xg, wg)
        org_max = wg.abs().amax(dim=-1, keepdim=True)  # [rows, ng, 1]
        best_err = torch.full(org_max.shape[:2], float("inf"))
        best_max = org_max.clone()
        for ratio in CLIP_RATIOS:
            m = org_max * ratio
            cw = torch.maximum(torch.minimum(wg, m), -m)
            deq = fake_quantize(cw.reshape(cw.shape[0], -1), group).reshape(cw.shape)
            err = (torch.einsum("ngk,rgk->nrg", xg, deq) - ref).pow(2).mean(dim=0)  # [rows, ng]
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_max = torch.where(better.unsqueeze(-1), m, best_max)
        clipped = torch.maximum(torch.minimum(wg, best_max), -best_max)
        result[r0:r0 + chunk] = clipped.reshape(-1, k)
    return result
