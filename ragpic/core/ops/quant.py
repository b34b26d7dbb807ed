"""The int8 KV codec, both halves: quantize (the store, when it writes an int8 entry) and
dequantize (link, on whatever device the int8 tensors are on).

The store's int8 entries (``ragpic/cache/format/entry.py``) hold symmetric absmax int8 per
(layer, head, token) row of ``D`` values plus one bf16 scale per row. Dequantizing where the
KV is used, on the GPU, halves the bytes that cross PCIe and lets the hot tier hold twice
the chunks. This is ragpic's one int8 dequantizer (the store decodes int8 entries to int8
KV and leaves the floats to link), so every reader gets bit-identical values. The codec lives
here, not in the cache, because the core needs the decoder and never imports the cache.
"""

from __future__ import annotations

import torch

__all__ = ["dequantize_int8", "quantize_int8"]


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(..., D)`` int8 times ``(...)`` per-row scales (bf16) -> ``(..., D)`` in ``dtype``.

    Computed in fp32 (exact: an int8 times a bf16 fits fp32's mantissa), then cast once.
    Keep ``dtype`` fp32 for keys that are rotated next: one rounding fewer.
    """
    return (q.to(torch.float32) * scale.to(torch.float32).unsqueeze(-1)).to(dtype)


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric absmax int8 over the last dim: ``(..., D)`` float -> ``(..., D)`` int8, ``(...)`` bf16.

    Each scale is ``absmax / 127`` rounded *up* to bf16, so ``|q| <= 127`` without clipping;
    its inverse is :func:`dequantize_int8`.

    Raises:
        ValueError: if ``x`` holds inf or NaN.
    """
    xf = x.float()
    amax = xf.abs().amax(dim=-1)
    if not bool(torch.isfinite(amax).all()):
        raise ValueError("int8 quantisation needs finite KV; got inf or NaN")
    want = amax / 127.0
    scale = want.to(torch.bfloat16)
    low = scale.float() < want
    scale = torch.where(low, torch.nextafter(scale, torch.full_like(scale, float("inf"))), scale)
    safe = torch.where(scale > 0, scale.float(), torch.ones_like(want))
    q = torch.round(xf / safe.unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
    return q, scale
