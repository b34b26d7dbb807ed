"""A fresh linked cache, and the rows link copies into it from compiled chunks."""

from __future__ import annotations

from collections.abc import Sequence

from ragpic.core.model import LoadedModel
from ragpic.core.ops.linked_cache import LinkedCache
from ragpic.core.ops.rope import rotate_keys
from ragpic.core.ops.slab_pool import SlabPool
from ragpic.core.segments import Segment, segment_starts

__all__ = ["fill_cached_rows", "new_cache"]


def new_cache(lm: LoadedModel, capacity: int, pool: SlabPool | None = None) -> LinkedCache:
    """An empty cache for ``capacity`` rows, on a pool's idle memory when one is given."""
    if pool is not None:
        return pool.cache(lm.num_layers, lm.num_kv_heads, lm.head_dim, capacity, dtype=lm.dtype, device=lm.device)
    return LinkedCache(lm.num_layers, lm.num_kv_heads, lm.head_dim, capacity, dtype=lm.dtype, device=lm.device)


def fill_cached_rows(lm: LoadedModel, cache: LinkedCache, segments: Sequence[Segment]) -> None:
    """Write each chunk's KV at its rows, keys re-rotated from compile to global positions.

    A chunk at global start ``s`` compiled at base position ``b`` is rotated by ``s - b``
    (exact: RoPE rotations compose); rows of text segments are left for the forward to write.
    """
    for seg, start in zip(segments, segment_starts(segments)):
        if seg.kv is None:
            continue
        kv = seg.kv.to(lm.device, lm.dtype)
        keys, values = cache.rows(start, kv.num_tokens)
        rotate_keys(kv.keys, start - kv.base_position, lm.inv_freq, out=keys)
        values.copy_(kv.values)
