"""int8 KV back to floats, on whatever device the int8 tensors are on.

The store's int8 entries (``ragpic/cache/entry.py``) hold symmetric absmax int8 per
(layer, head, token) row of ``D`` values plus one bf16 scale per row. Dequantizing where the
KV is used, on the GPU, halves the bytes that cross PCIe and lets the hot tier hold twice
the chunks. This is ragpic's one int8 dequantizer (the store decodes int8 entries to int8
KV and leaves the floats to link), so every reader gets bit-identical values.
"""

from __future__ import annotations

import torch

__all__ = ["dequantize_int8"]


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(..., D)`` int8 times ``(...)`` per-row scales (bf16) -> ``(..., D)`` in ``dtype``.

    Computed in fp32 (exact: an int8 times a bf16 fits fp32's mantissa), then cast once.
    Keep ``dtype`` fp32 for keys that are rotated next: one rounding fewer.
    """
    return (q.to(torch.float32) * scale.to(torch.float32).unsqueeze(-1)).to(dtype)
