"""Move post-RoPE keys to new positions by one more rotation (exact, in fp32)."""

from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """HF/GPT-NeoX convention: the first half of head_dim pairs with the second half."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_keys(keys: torch.Tensor, delta: torch.Tensor | int, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate keys that carry RoPE at positions ``p`` so they carry it at ``p + delta``.

    RoPE is a rotation by ``p * inv_freq`` per frequency pair, and rotations compose, so
    ``R(p + d) k = R(d) R(p) k``: no pre-RoPE keys are needed. The rotation is done in fp32
    (bf16 cos/sin alone cost ~1e-2 error) and cast back to ``keys.dtype``.

    Args:
        keys: ``(..., T, D)`` post-RoPE keys (any leading dims, e.g. ``(L, H, T, D)``).
        delta: a scalar shift, or ``(T,)`` int64 per-token shifts.
        inv_freq: ``(D_rot/2,)`` fp32 inverse frequencies; when ``D_rot < D`` only the first
            ``D_rot`` dims rotate (partial rotary).
    Returns:
        ``(..., T, D)`` rotated keys, same dtype and device as ``keys``.
    """
    d_rot = 2 * inv_freq.numel()
    delta = torch.as_tensor(delta, device=keys.device)
    if delta.dim() == 0:
        delta = delta.expand(keys.shape[-2])
    if not bool(delta.any()):
        return keys
    freqs = delta.to(torch.float32)[:, None] * inv_freq.to(keys.device, torch.float32)[None, :]  # (T, D_rot/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    k = keys[..., :d_rot].to(torch.float32)
    rotated = (k * cos + rotate_half(k) * sin).to(keys.dtype)
    if d_rot == keys.shape[-1]:
        return rotated
    return torch.cat((rotated, keys[..., d_rot:]), dim=-1)
