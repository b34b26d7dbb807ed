"""Attention for one batched decode step: each row attends over its own request's cache.

Continuous batching (``ragpic serve``) runs the next token of every active request as one
``(B, 1)`` forward: the linear layers see a ``(B, hidden)`` matrix, which is what batching
saves (decode reads every weight once per step, whatever ``B`` is). Attention cannot be
batched the same way without padding, because each request's prompt has its own length;
it is also the cheap part of a decode step. So each row ``b`` runs its own SDPA over rows
``[key_start_b, length_b)`` of its own linked cache, read in place (no copy, no padding).

:func:`batched_sdpa` is reached through ragpic's registered attention function
(:func:`ragpic.core.ops.attention.banded_sdpa`) when the forward carries ``ragpic_batch``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
import torch.nn.functional as F

__all__ = ["BatchRows", "batched_sdpa"]


class BatchRows(Protocol):
    """What a batched forward hands attention (see :class:`ragpic.core.batch.BatchedCache`)."""

    def rows(self, layer: int) -> Sequence[tuple[torch.Tensor, torch.Tensor]]:
        """Per batch row, ``(1, H_kv, S_b, D)`` keys and values it sees in ``layer`` (its new
        token's K/V already written)."""
        ...


def batched_sdpa(module: torch.nn.Module, query: torch.Tensor, batch: BatchRows, *, dropout: float = 0.0,
                 scaling: float | None = None) -> tuple[torch.Tensor, None]:
    """Per-row SDPA of ``(B, H, 1, D)`` queries; returns ``((B, 1, H, D) output, None)``.

    A decode token sees every key it is given (the window, if any, is cut by ``batch``), so
    no mask is needed. GQA K/V are read in place, never repeated per head.
    """
    kv = batch.rows(int(module.layer_idx))
    if len(kv) != query.shape[0]:
        raise ValueError(f"batched attention: {query.shape[0]} query rows but {len(kv)} caches")
    bsz, heads, _, dim = query.shape
    kv_heads = kv[0][0].shape[1]
    # The g = H / H_kv query heads sharing a KV head become g query *rows* of that head: one
    # token sees every key, so no mask is needed and K/V are read once, never repeated per head.
    q = query.reshape(bsz, kv_heads, heads // kv_heads, dim)
    out = query.new_empty(bsz, kv_heads, heads // kv_heads, kv[0][1].shape[-1])
    for b, (k, v) in enumerate(kv):
        out[b:b + 1] = F.scaled_dot_product_attention(q[b:b + 1], k, v, dropout_p=dropout, scale=scaling)
    return out.reshape(bsz, heads, 1, -1).transpose(1, 2).contiguous(), None
