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

from ragpic.core.ops.sdpa import grouped_sdpa

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
    bsz, heads, _, _ = query.shape
    out = query.new_empty(bsz, heads, 1, kv[0][1].shape[-1])
    for b, (k, v) in enumerate(kv):
        # grouped_sdpa, not a fold of the g query heads into rows: on the CPU the fold leaves
        # H_kv work items (3 for SmolLM2) to share the threads, enable_gqa gives H of them.
        out[b:b + 1] = grouped_sdpa(query[b:b + 1], k, v, None, dropout, scaling)
    return out.transpose(1, 2).contiguous(), None
