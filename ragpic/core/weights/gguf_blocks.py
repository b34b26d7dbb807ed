"""A GGUF's 4-bit blocks as int4 codes, scales and zero points, without re-quantizing.

Q4_0, Q4_1 and Q4_K store every 32 consecutive inputs of a row as 4-bit codes ``q`` with one
affine map, which is exactly the int4 layer's ``(q - 8) * scale + zero`` per 32-group
(:mod:`ragpic.core.weights.linear`):

- Q4_0 (18-byte blocks): ``w = d * (q - 8)``, so ``scale = d``, ``zero = 0``;
- Q4_1 (20-byte blocks): ``w = d * q + m``, so ``scale = d``, ``zero = m + 8 d``;
- Q4_K (144-byte super-blocks of 256 = 8 groups of 32): ``w = d * sc_j * q - dmin * m_j`` with
  6-bit ``sc_j``, ``m_j``, so ``scale = d sc_j``, ``zero = 8 d sc_j - dmin m_j``.

Every other type (Q5_0, Q6_K, Q8_0, ...) has more than 4 bits or groups the kernels cannot
express, and is re-quantized (:mod:`ragpic.core.weights.apply`). The maps are computed in fp32;
held in bf16 the scale and zero round to 8 bits of mantissa (docs/RESULTS.md §17).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["EXACT_TYPES", "int4_blocks"]

EXACT_TYPES = ("Q4_0", "Q4_1", "Q4_K")


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """``(..., 16)`` bytes of one 32-block -> ``(..., 32)`` codes: low nibbles first, then high."""
    return np.concatenate((qs & 15, qs >> 4), axis=-1)


def _q4_0(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d = raw[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
    return _nibbles(raw[..., 2:18]), d, np.zeros_like(d)


def _q4_1(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d = raw[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    return _nibbles(raw[..., 4:20]), d, m + 8 * d


def _q4_k(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(..., 144)`` super-blocks -> codes ``(..., 8, 32)``, scale and zero ``(..., 8)``."""
    d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    dmin = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    s = raw[..., 4:16].astype(np.int32)  # 8 six-bit scales and 8 six-bit mins, packed in 12 bytes
    sc = np.concatenate((s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)), axis=-1)
    mn = np.concatenate((s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)), axis=-1)
    qs = raw[..., 16:144].reshape(*raw.shape[:-1], 4, 32)  # 4 x 32 bytes: groups 2j (low), 2j+1 (high)
    codes = np.stack((qs & 15, qs >> 4), axis=-2).reshape(*raw.shape[:-1], 8, 32)
    scale = d[..., None] * sc.astype(np.float32)
    return codes, scale, 8 * scale - dmin[..., None] * mn.astype(np.float32)


_BLOCK = {"Q4_0": (18, 32, _q4_0), "Q4_1": (20, 32, _q4_1), "Q4_K": (144, 256, _q4_k)}


def int4_blocks(type_name: str, raw: np.ndarray, rows: int, cols: int) -> tuple[torch.Tensor, ...]:
    """A tensor's raw blocks -> ``(N, K)`` uint8 codes, ``(K/32, N)`` fp32 scales and zeros.

    Args:
        type_name: its GGML type (one of :data:`EXACT_TYPES`).
        raw: its bytes, ``(N, K / block * block_bytes)`` uint8 (``GGUFReader``'s ``data``).
        rows, cols: ``N`` (outputs) and ``K`` (inputs).
    """
    nbytes, per_block, decode = _BLOCK[type_name]
    blocks = np.ascontiguousarray(raw).reshape(rows, cols // per_block, nbytes)
    codes, scale, zero = decode(blocks)
    groups = cols // 32
    return (torch.from_numpy(np.ascontiguousarray(codes.reshape(rows, cols))).to(torch.uint8),
            torch.from_numpy(np.ascontiguousarray(scale.reshape(rows, groups).T)),
            torch.from_numpy(np.ascontiguousarray(zero.reshape(rows, groups).T)))
