"""The compiled KV of one chunk: what compile produces, the store keeps and link consumes.

Also the two operations on it that link runs where the KV is used: int8 back to floats
(:func:`dequantize_int8`, the store's int8 entries) and keys moved to new positions by one more
RoPE rotation (:func:`rotate_keys`); :func:`device_kv` combines them into the rows a linked
cache takes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ragpic.core.compile_recipe import PLAIN
from ragpic.core.ops.device import to_device

__all__ = ["ChunkKV", "dequantize_int8", "device_kv", "quantize_int8", "rotate_keys"]


@dataclass(slots=True, frozen=True)
class ChunkKV:
    """Per-layer keys and values of one chunk, compiled alone.

    Attributes:
        token_ids: ``(T,)`` int64 ids of the chunk's own tokens (dummy tokens excluded).
        keys: ``(L, H_kv, T, D)`` keys **after** RoPE, token ``i`` rotated to position
            ``base_position + i``. dtype is the model's (fp32 on CPU, bf16/fp16 on GPU).
        values: ``(L, H_kv, T, D)`` values, same dtype.
        base_position: position of the chunk's first token at compile time
            (0 for ``plain``, N for ``bosN``). Link rotates keys by ``start - base_position``.
        fingerprint: the model fingerprint whose forward pass produced this KV.
        recipe: ``plain`` or ``bos<N>`` (see :func:`dummy_recipe`).
        key_scales, value_scales: ``(L, H_kv, T)`` bf16 per-row scales when ``keys`` and
            ``values`` are int8 (the store's int8 entries, dequantized on the device at link
            by :func:`dequantize_int8`); None for float KV.
        quant_dtype: the dtype int8 KV stands for (the model dtype it was compiled in).

    ``token_ids`` are host data (they pick segments, never enter a kernel at link): they stay
    on the CPU whatever device the KV is on.
    """

    token_ids: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    base_position: int
    fingerprint: str
    recipe: str = PLAIN
    key_scales: torch.Tensor | None = None
    value_scales: torch.Tensor | None = None
    quant_dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        if self.keys.shape != self.values.shape or self.keys.dim() != 4:
            raise ValueError(
                f"keys/values must both be (layers, kv_heads, tokens, head_dim); got "
                f"{tuple(self.keys.shape)} and {tuple(self.values.shape)}"
            )
        if self.token_ids.dim() != 1 or self.token_ids.numel() != self.keys.shape[2]:
            raise ValueError(
                f"token_ids has {self.token_ids.numel()} ids but KV holds {self.keys.shape[2]} tokens"
            )
        if (self.key_scales is None) != (self.value_scales is None):
            raise ValueError("int8 KV needs both key_scales and value_scales")
        if self.key_scales is not None:
            rows = tuple(self.keys.shape[:3])
            if self.keys.dtype != torch.int8 or self.values.dtype != torch.int8 or self.quant_dtype is None:
                raise ValueError("scaled KV must be int8 keys and values with a quant_dtype")
            if tuple(self.key_scales.shape) != rows or tuple(self.value_scales.shape) != rows:
                raise ValueError(f"int8 KV scales must be (layers, kv_heads, tokens) = {rows}")

    @property
    def is_quantized(self) -> bool:
        return self.key_scales is not None

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the KV stands for: the model's (int8 KV: ``quant_dtype``)."""
        return self.quant_dtype if self.is_quantized else self.keys.dtype

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.numel())

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values (and int8 scales) as held."""
        scales = 0 if self.key_scales is None else 2 * self.key_scales.numel() * self.key_scales.element_size()
        return self.keys.numel() * self.keys.element_size() * 2 + scales

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> "ChunkKV":
        """A copy with keys and values on ``device`` (ids stay on the CPU).

        ``dtype`` converts float KV; int8 KV given a ``dtype`` is dequantized to it on
        ``device`` (after the copy: half the bytes move), else it stays int8.
        """
        device = torch.device(device)
        keys, values = to_device(self.keys, device), to_device(self.values, device)
        scales = None
        if self.is_quantized:
            scales = (to_device(self.key_scales, device), to_device(self.value_scales, device))
            if dtype is not None:
                keys, values = dequantize_int8(keys, scales[0], dtype), dequantize_int8(values, scales[1], dtype)
                scales = None
        elif dtype is not None:
            keys, values = keys.to(dtype), values.to(dtype)
        return ChunkKV(
            token_ids=self.token_ids.to("cpu"), keys=keys, values=values, base_position=self.base_position,
            fingerprint=self.fingerprint, recipe=self.recipe,
            key_scales=None if scales is None else scales[0], value_scales=None if scales is None else scales[1],
            quant_dtype=self.quant_dtype if scales is not None else None,
        )


# ----------------------------------------------------------------------------- the int8 codec
# Both halves of int8 live here: quantize (the store, when it writes an int8 entry) and
# dequantize (link, on whatever device the int8 tensors are on). The codec is in the core, not
# the cache, because the core needs the decoder and never imports the cache (ARCHITECTURE §3).
# The store's int8 entries (ragpic/cache/format/entry.py) hold symmetric absmax int8 per (layer, head,
# token) row of D values plus one bf16 scale per row. Dequantizing where the KV is used, on the
# GPU, halves the bytes that cross PCIe and lets the hot tier hold twice the chunks. This is
# ragpic's one int8 dequantizer (the store decodes int8 entries to int8 KV and leaves the floats
# to link), so every reader gets bit-identical values.


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


# ----------------------------------------------------------------------------- re-rotation
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


def device_kv(kv: ChunkKV, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(L, H_kv, T, D)`` keys and values of ``kv`` on ``device``, ready to go into cache rows.

    Host KV moves asynchronously (pinned, non-blocking on CUDA) in its stored dtype; int8 KV
    moves as int8 plus scales (half the bytes of bf16) and is dequantized there, keys to fp32
    (they are rotated next, in fp32) and values to the dtype they stand for. Token ids stay
    on the host. Float KV already on ``device`` is returned as is (no copy on the CPU path).
    """
    keys, values = to_device(kv.keys, device), to_device(kv.values, device)
    if kv.is_quantized:
        keys = dequantize_int8(keys, to_device(kv.key_scales, device), torch.float32)
        values = dequantize_int8(values, to_device(kv.value_scales, device), kv.quant_dtype)
    return keys, values
