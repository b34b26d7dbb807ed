"""The compiled KV of one chunk: what compile produces, the store keeps and link consumes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ragpic.core.methods import PLAIN


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
    """

    token_ids: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    base_position: int
    fingerprint: str
    recipe: str = PLAIN

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

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.numel())

    @property
    def nbytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() * 2

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> "ChunkKV":
        """A copy on ``device`` (and ``dtype`` if given); ids stay int64."""
        return ChunkKV(
            token_ids=self.token_ids.to(device),
            keys=self.keys.to(device=device, dtype=dtype or self.keys.dtype),
            values=self.values.to(device=device, dtype=dtype or self.values.dtype),
            base_position=self.base_position,
            fingerprint=self.fingerprint,
            recipe=self.recipe,
        )
