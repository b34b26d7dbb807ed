"""One decode step for several requests at once: a ``(B, 1)`` forward over their own caches.

Continuous batching (``ragpic serve``) keeps every active request's :class:`LinkedCache`
as link left it and, each step, feeds their next tokens through the model together. The
linear layers then read each weight once for ``B`` tokens (decode is memory-bound, so that is
most of the saving). Attention cannot be batched the same way without padding, because each
request's prompt has its own length; it is also the cheap part of a decode step. So each row
``b`` runs its own SDPA over rows ``[key_start_b, positions[b]]`` of its own linked cache, read
in place (no copy, no padding). :class:`BatchedCache` is both the transformers ``Cache`` the
forward writes through (row ``b``'s new K/V go to row ``positions[b]`` of request ``b``'s
cache) and the step's attention plan (:meth:`BatchedCache.attend`, which ragpic's attention
function calls).

The model runner (:meth:`ragpic.core.runner.ModelRunner.decode`) batches through this cache
for the models its lean step does not serve (gemma). Only models running ragpic's attention
(``ragpic_sdpa``) can consume the per-row plan; :func:`supports_batching` says so, and the
caller steps other models one request at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from ragpic.core.model import LoadedModel
from ragpic.core.ops.attention import grouped_sdpa, uses_banded_attention
from ragpic.core.ops.linked_cache import LinkedCache

__all__ = ["BatchedCache", "supports_batching"]


class _BatchLayer(CacheLayerMixin):
    """One layer of a :class:`BatchedCache`: writes each row into its request's slab."""

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, owner: "BatchedCache", index: int):
        super().__init__()
        self._owner, self._index = owner, index
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:  # the requests' slabs exist
        return None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write ``(B, H_kv, 1, D)`` states row by row; return them unchanged (a placeholder:
        batched attention reads each request's cache itself)."""
        self._owner.write(self._index, key_states, value_states)
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._owner.max_length, 0

    def get_seq_length(self) -> int:
        return self._owner.max_length

    def get_max_length(self) -> int:
        return self._owner.max_length


class BatchedCache(Cache):
    """The caches of ``B`` requests, each taking one new token at its own position.

    Args:
        caches: one :class:`LinkedCache` per batch row, each with a free row at its position.
        positions: per row, the new token's position (= rows already filled).
        sliding_window: the model's window; a row then sees keys ``(p - window, p]`` only.
    """

    def __init__(self, caches: Sequence[LinkedCache], positions: Sequence[int], sliding_window: int | None = None):
        if len(caches) != len(positions) or not caches:
            raise ValueError(f"caches ({len(caches)}) and positions ({len(positions)}) must be non-empty, one each")
        for c, p in zip(caches, positions):
            if p >= c.capacity:
                raise ValueError(f"position {p} is past a linked cache of {c.capacity} rows")
        self.caches, self.positions = list(caches), [int(p) for p in positions]
        self.window = sliding_window
        self.max_length = max(self.positions) + 1
        self.layers_read = 0  # attend() calls: one per layer when attention honoured the plan
        super().__init__(layers=[_BatchLayer(self, i) for i in range(caches[0].key_slab.shape[0])])

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """``(B, H_kv, 1, D)`` new keys/values -> row ``positions[b]`` of cache ``b``."""
        for b, (c, p) in enumerate(zip(self.caches, self.positions)):
            c.key_slab[layer, 0, :, p] = keys[b, :, 0]
            c.value_slab[layer, 0, :, p] = values[b, :, 0]

    def rows(self, layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per row, ``(1, H_kv, S_b, D)`` views of the keys/values its token sees (its new
        token's K/V already written)."""
        out = []
        for c, p in zip(self.caches, self.positions):
            start = max(0, p - self.window + 1) if self.window else 0
            out.append((c.key_slab[layer][:, :, start:p + 1], c.value_slab[layer][:, :, start:p + 1]))
        return out


    def attend(self, module, query: torch.Tensor, key, value, dropout: float = 0.0,
               scaling: float | None = None) -> torch.Tensor:
        """Per-row SDPA of ``(B, H, 1, D)`` queries, each over its own cache -> ``(B, 1, H, D)``.

        ``key``/``value`` (the placeholders ``update`` returned) are ignored. A decode token sees
        every key it is given (the window, if any, is cut by :meth:`rows`), so no mask is needed.
        """
        self.layers_read += 1
        kv = self.rows(int(module.layer_idx))
        if len(kv) != query.shape[0]:
            raise ValueError(f"batched attention: {query.shape[0]} query rows but {len(kv)} caches")
        bsz, heads, _, _ = query.shape
        out = query.new_empty(bsz, heads, 1, kv[0][1].shape[-1])
        for b, (k, v) in enumerate(kv):
            # a decode row folds its g query heads into rows, as the lean step does (grouped_sdpa's rule)
            out[b:b + 1] = grouped_sdpa(query[b:b + 1], k, v, None, dropout, scaling, fold=True)
        return out.transpose(1, 2).contiguous()


def supports_batching(lm: LoadedModel) -> bool:
    """Whether ``lm`` runs ragpic's attention, the one that reads a batched step's per-row plan."""
    return uses_banded_attention(lm.model)
