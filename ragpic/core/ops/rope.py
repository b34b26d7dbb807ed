"""Move post-RoPE keys to new positions by one more rotation (exact, in fp32)."""

from __future__ import annotations

import torch


def rotate_keys(keys: torch.Tensor, delta: torch.Tensor | int, inv_freq: torch.Tensor,
                *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate keys that carry RoPE at positions ``p`` so they carry it at ``p + delta``.

    RoPE is a rotation by ``p * inv_freq`` per frequency pair, and rotations compose, so
    ``R(p + d) k = R(d) R(p) k``: no pre-RoPE keys are needed. The rotation is done in fp32
    (bf16 cos/sin alone cost ~1e-2 error) and cast back to ``keys.dtype``.

    Args:
        keys: ``(..., T, D)`` post-RoPE keys (any leading dims, e.g. ``(L, H, T, D)``).
        delta: an int shift (host value: the fast path, no device tensor made, nothing read
            back), or ``(T,)`` int64 per-token shifts (on any device).
        inv_freq: ``(D_rot/2,)`` fp32 inverse frequencies; when ``D_rot < D`` only the first
            ``D_rot`` dims rotate (partial rotary).
        out: optional ``(..., T, D)`` destination (e.g. rows of a linked cache); fp32 keys
            are then rotated straight into it, with no temporaries the size of ``keys``.
    Returns:
        ``(..., T, D)`` rotated keys (``out`` when given), same dtype and device as ``keys``.
    """
    inv_freq = inv_freq.to(keys.device, torch.float32)
    if isinstance(delta, torch.Tensor):
        # (T or 1, D_rot/2) angles. No zero test here: on a GPU it would be a sync.
        freqs = delta.to(keys.device, torch.float32).reshape(-1)[:, None] * inv_freq[None, :]
    else:
        if int(delta) == 0:
            return keys if out is None else out.copy_(keys)
        freqs = (inv_freq * float(delta))[None, :]  # (1, D_rot/2), broadcast over T: same fp32 product
    cos, sin = freqs.cos(), freqs.sin()
    if out is not None and keys.dtype == out.dtype == torch.float32:
        return _rotate_into(out, keys, cos, sin)
    k = keys.to(torch.float32)
    rotated = _rotate_into(torch.empty_like(k), k, cos, sin)
    if out is not None:
        return out.copy_(rotated)  # one cast, straight into the destination
    return rotated.to(keys.dtype)


def _rotate_into(out: torch.Tensor, keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``out = R(angle) keys`` for fp32 tensors, half by half; cos/sin are ``(T or 1, D_rot/2)``.

    HF/GPT-NeoX convention: dim ``i`` pairs with dim ``i + D_rot/2``; dims past ``D_rot``
    (partial rotary) pass through unchanged.
    """
    h = cos.shape[-1]
    k1, k2 = keys[..., :h], keys[..., h:2 * h]
    o1, o2 = out[..., :h], out[..., h:2 * h]
    torch.mul(k1, cos, out=o1)
    o1.addcmul_(k2, sin, value=-1)
    torch.mul(k2, cos, out=o2)
    o2.addcmul_(k1, sin)
    if 2 * h < keys.shape[-1]:
        out[..., 2 * h:] = keys[..., 2 * h:]
    return out
