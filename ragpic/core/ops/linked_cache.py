"""A preallocated KV cache whose layers write fresh K/V at given rows.

transformers' own caches append (``DynamicCache``) or ignore the write position
(``StaticCache`` in 5.x). Linking needs the opposite: every row of the prompt is already
filled with (re-rotated) cached KV, and the forward pass over the few recomputed tokens
must overwrite exactly their rows, in every layer, before that layer attends.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class RowWriteLayer(CacheLayerMixin):
    """One layer's K/V: views into ``(1, H_kv, capacity, D)`` slabs owned by :class:`LinkedCache`."""

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, owner: "LinkedCache", index: int):
        super().__init__()
        self._owner = owner
        self.keys = owner.key_slab[index]
        self.values = owner.value_slab[index]
        self.device = self.keys.device
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:  # slabs are preallocated
        return None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write ``(1, H_kv, R, D)`` states at the owner's ``write_rows``; return rows ``[0, length)``."""
        rows = self._owner.write_rows
        self.keys.index_copy_(2, rows, key_states.to(self.keys.dtype))
        self.values.index_copy_(2, rows, value_states.to(self.values.dtype))
        n = self._owner.length
        return self.keys[:, :, :n], self.values[:, :, :n]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._owner.length, 0

    def get_seq_length(self) -> int:
        return self._owner.length

    def get_max_length(self) -> int:
        return self._owner.capacity


class LinkedCache(Cache):
    """KV of a whole prompt (plus room to decode), filled by link, read by decode.

    Attributes:
        key_slab, value_slab: ``(L, 1, H_kv, capacity, D)`` in the model dtype.
        length: rows visible to attention in the next forward (prompt + generated so far).
        write_rows: ``(R,)`` int64 rows the next forward's R tokens are written to.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int,
                 *, dtype: torch.dtype, device: torch.device,
                 slabs: tuple[torch.Tensor, torch.Tensor] | None = None):
        """``slabs``: reuse these ``(L, 1, H_kv, >= capacity, D)`` tensors (from a ``SlabPool``)."""
        if slabs is None:
            shape = (num_layers, 1, num_kv_heads, capacity, head_dim)
            # Uninitialised on purpose (zeroing costs ~6% of a link): every row below `length` is
            # written before attention reads it, either by link's fill or by the forward that computes it.
            slabs = (torch.empty(shape, dtype=dtype, device=device), torch.empty(shape, dtype=dtype, device=device))
        self._slabs = slabs
        self.key_slab = slabs[0][:, :, :, :capacity]
        self.value_slab = slabs[1][:, :, :, :capacity]
        self.capacity = capacity
        self.length = 0
        self.write_rows = torch.zeros(0, dtype=torch.long, device=device)
        super().__init__(layers=[RowWriteLayer(self, i) for i in range(num_layers)])

    def detach_slabs(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Give up the memory (for reuse); any later read or write of this cache fails loudly."""
        slabs, self._slabs = self._slabs, None
        self.key_slab = self.value_slab = None
        for layer in self.layers:
            layer.keys = layer.values = None
        return slabs

    def rows(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(L, H_kv, count, D)`` views of every layer's K and V at rows ``[start, start+count)``."""
        return (self.key_slab[:, 0, :, start:start + count], self.value_slab[:, 0, :, start:start + count])

    def prepare(self, write_rows: torch.Tensor, length: int) -> None:
        """Before a forward: its tokens go to ``write_rows``; attention sees rows ``[0, length)``."""
        if length > self.capacity:
            raise ValueError(f"linked cache holds {self.capacity} rows, {length} requested")
        self.write_rows = write_rows
        self.length = length
