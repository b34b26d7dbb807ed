"""The compiled KV of one chunk: what compile produces, the store keeps and link consumes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ragpic.core.methods import PLAIN
from ragpic.core.ops.device import to_device
from ragpic.core.ops.quant import dequantize_int8


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
            by :func:`ragpic.core.ops.quant.dequantize_int8`); None for float KV.
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
