"""One SDPA call over grouped-query K/V, read in place: never repeated per query head.

Shared by the banded prefill/link attention (:mod:`ragpic.core.ops.attention`) and the
batched decode step (:mod:`ragpic.core.ops.batched_attention`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["fold_mask", "grouped_sdpa"]


def fold_mask(mask: torch.Tensor, groups: int) -> torch.Tensor:
    """``(B, 1, R, S)`` -> ``(B, 1, groups x R, S)``: row ``j x R + i`` is row ``i`` (head ``j``'s copy)."""
    b, _, r, s = mask.shape
    return mask.expand(b, groups, r, s).reshape(b, 1, groups * r, s)


def grouped_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                 dropout: float = 0.0, scaling: float | None = None, *, fold: bool | None = None) -> torch.Tensor:
    """SDPA of ``(B, H, R, D)`` queries over ``(B, H_kv, S, D)`` keys without copying K/V per head.

    On the CPU, torch's flash kernel takes ``enable_gqa`` with a mask. Elsewhere the
    ``g = H / H_kv`` query heads that share a KV head are folded into the row dim instead (the
    mask is repeated for them, unless it already has ``g x R`` rows), which every fused kernel
    handles. ``fold`` forces either way; ``mask`` None means every row sees every key.
    Returns ``(B, H, R, D_v)``, in whatever memory layout the kernel chose.
    """
    b, h, r, d = query.shape
    kv_heads = key.shape[1]
    if fold is None:
        fold = query.device.type != "cpu"
    if not fold or h == kv_heads:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling,
                                              enable_gqa=h != kv_heads)
    g = h // kv_heads
    q = query.reshape(b, kv_heads, g * r, d)
    if mask is not None and mask.shape[-2] != g * r:
        mask = fold_mask(mask, g)
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    # reshape, not view: CUDA's memory-efficient kernel returns (B, H_kv, g R, D) in a transposed
    # layout, which no view can split back into heads (issue 18, item 1).
    return out.reshape(b, h, r, out.shape[-1])
