"""A fresh linked cache, and the rows link copies into it from compiled chunks."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ragpic.core.kv import ChunkKV
from ragpic.core.model import LoadedModel
from ragpic.core.ops.device import to_device
from ragpic.core.ops.linked_cache import LinkedCache
from ragpic.core.ops.quant import dequantize_int8
from ragpic.core.ops.rope import rotate_keys
from ragpic.core.ops.slab_pool import SlabPool
from ragpic.core.segments import Segment, segment_starts

__all__ = ["device_kv", "fill_cached_rows", "new_cache"]


def new_cache(lm: LoadedModel, capacity: int, pool: SlabPool | None = None) -> LinkedCache:
    """An empty cache for ``capacity`` rows, on a pool's idle memory when one is given."""
    if pool is not None:
        return pool.cache(lm.num_layers, lm.num_kv_heads, lm.head_dim, capacity, dtype=lm.dtype, device=lm.device)
    return LinkedCache(lm.num_layers, lm.num_kv_heads, lm.head_dim, capacity, dtype=lm.dtype, device=lm.device)


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


def fill_cached_rows(lm: LoadedModel, cache: LinkedCache, segments: Sequence[Segment]) -> None:
    """Write each chunk's KV at its rows, keys re-rotated from compile to global positions.

    A chunk at global start ``s`` compiled at base position ``b`` is rotated by ``s - b``
    (exact: RoPE rotations compose; an int, so no device tensor is made for it); rows of
    text segments are left for the forward to write. Casts to the model dtype happen in the
    writes into the cache, on the device.
    """
    for seg, start in zip(segments, segment_starts(segments)):
        if seg.kv is None:
            continue
        keys, values = device_kv(seg.kv, lm.device)
        key_rows, value_rows = cache.rows(start, seg.kv.num_tokens)
        rotate_keys(keys, int(start - seg.kv.base_position), lm.inv_freq, out=key_rows)
        value_rows.copy_(values)
