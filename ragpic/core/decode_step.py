"""Device-side state of one decode: what each token's forward reuses instead of rebuilding.

A decode step is a one-row forward, so its fixed costs dominate on a GPU: building small
tensors from Python values (a blocking host-to-device copy each), a fresh mask, bands.
:class:`DecodeBuffers` makes them once per generation: every position on the device, one
additive mask row whose growing prefix is each step's mask, and one id slot for sampled
tokens. Greedy tokens never leave the device to be fed back; the host reads each one once,
to yield it (the one sync a streamed token needs).
"""

from __future__ import annotations

import torch

from ragpic.core.forward import forward_rows
from ragpic.core.model import LoadedModel
from ragpic.core.ops.linked_cache import LinkedCache

__all__ = ["DecodeBuffers"]

_ALIGN = 16  # mask rows padded to 16 elements: fused SDPA kernels want aligned mask strides


class DecodeBuffers:
    """Positions, mask and an id slot for decoding up to ``steps`` tokens after ``prompt_len``.

    Attributes:
        positions: ``(steps,)`` int64 on the device: ``prompt_len + i`` for step ``i``.
        mask: ``(1, 1, 1, W)`` additive mask row in the model dtype, ``W >= prompt_len + steps``;
            step ``i`` uses its first ``prompt_len + i + 1`` columns. Zeros, except keys a
            sliding window has left behind, masked as the window moves (one small fill a step).
        ids: ``(1,)`` int64 slot for a token chosen on the host (sampling).
    """

    def __init__(self, lm: LoadedModel, prompt_len: int, steps: int):
        dev = lm.device
        self.prompt_len = prompt_len
        self.window = lm.sliding_window
        self.positions = torch.arange(prompt_len, prompt_len + steps, device=dev)
        width = -(-(prompt_len + steps) // _ALIGN) * _ALIGN
        self.mask = torch.zeros((1, 1, 1, width), dtype=lm.dtype, device=dev)
        self._masked_upto = 0  # keys [0, _masked_upto) are masked already
        self._min = torch.finfo(lm.dtype).min
        self.ids = torch.zeros(1, dtype=torch.long, device=dev)

    def step_mask(self, i: int) -> torch.Tensor:
        """``(1, 1, 1, prompt_len + i + 1)`` mask for the token at position ``prompt_len + i``."""
        p = self.prompt_len + i
        if self.window is not None and p - self.window + 1 > self._masked_upto:
            self.mask[..., self._masked_upto:p - self.window + 1] = self._min  # keys t <= p - window
            self._masked_upto = p - self.window + 1
        return self.mask[..., :p + 1]

    def forward(self, lm: LoadedModel, cache: LinkedCache, i: int, token: torch.Tensor | int) -> torch.Tensor:
        """``(V,)`` fp32 logits after feeding ``token`` (a ``(1,)`` device tensor, or a host
        int written into the id slot) at position ``prompt_len + i``."""
        if not isinstance(token, torch.Tensor):
            self.ids.fill_(token)  # a scalar kernel argument: no host-to-device copy
            token = self.ids
        p = self.prompt_len + i
        return forward_rows(lm, cache, token, self.positions[i:i + 1], p + 1, mask=self.step_mask(i))[-1].float()
