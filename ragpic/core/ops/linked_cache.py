"""A preallocated KV cache whose layers write fresh K/V at given rows.

transformers' own caches append (``DynamicCache``) or ignore the write position
(``StaticCache`` in 5.x). Linking needs the opposite: every row of the prompt is already
filled with (re-rotated) cached KV, and the forward pass over the few recomputed tokens
must overwrite exactly their rows, in every layer, before that layer attends. The rows a
forward writes travel with it (the ``ragpic_step`` forward argument, as transformers passes
``cache_position``), never as state set on the cache beforehand.

:class:`SlabPool` reuses the memory of finished caches for the next request.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from ragpic.core.ops.device import normalize_device

__all__ = ["LinkedCache", "RowWriteLayer", "SlabPool", "cuda_release_event", "cuda_wait", "step_of"]


def step_of(args: tuple, kwargs: dict) -> Any:
    """The forward step a layer's ``update`` was called with: transformers hands the attention's
    keyword arguments over as ``kwargs=`` (5.24+) or as a positional ``cache_kwargs`` dict.
    Anything with ``rows`` (``(R,)`` int64 positions on the cache's device) and ``length``."""
    for extra in (kwargs.get("kwargs"), kwargs.get("cache_kwargs"), *args):
        if isinstance(extra, dict) and extra.get("ragpic_step") is not None:
            return extra["ragpic_step"]
    raise ValueError("a LinkedCache is written by ragpic's forward step only: the forward had no ragpic_step "
                     "(ragpic.core.forward.step_inputs builds it)")


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
        """Write ``(1, H_kv, R, D)`` states at the step's ``rows``; return rows ``[0, step.length)``."""
        if self.keys is None:
            raise AttributeError("this linked cache's memory went back to its pool (SlabPool.release)")
        step = step_of(args, kwargs)
        self.keys.index_copy_(2, step.rows, key_states.to(self.keys.dtype))
        self.values.index_copy_(2, step.rows, value_states.to(self.values.dtype))
        return self.keys[:, :, :step.length], self.values[:, :, :step.length]

    def get_mask_sizes(self, query_length: int, *args) -> tuple[int, int]:
        # transformers asks only when no 4D mask is passed: ragpic's causal step, rows 0..R-1
        # seeing keys 0..R-1 (every other step passes its mask)
        return query_length, 0

    def get_seq_length(self) -> int:
        return self._owner.length

    def get_max_length(self) -> int:
        return self._owner.capacity


class LinkedCache(Cache):
    """KV of a whole prompt (plus room to decode), filled by link, read by decode.

    Attributes:
        key_slab, value_slab: ``(L, 1, H_kv, capacity, D)`` in the model dtype.
        length: rows filled so far (prompt + generated); each forward sets it to its step's length.
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
        super().__init__(layers=[RowWriteLayer(self, i) for i in range(num_layers)])

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return 0  # see RowWriteLayer.get_mask_sizes: the one step transformers masks starts at row 0

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


# ----------------------------------------------------------------------------- the pool
# A linked cache is large (2 x 94 MB for SmolLM2 at 4k tokens in fp32) and written once per
# request. On the CPU a fresh allocation of that size comes straight from the kernel, which
# zero-fills every page on first touch: a measurable share of a LegoLink link (docs/RESULTS.md §3).
# Serving systems preallocate their KV memory for this reason; the pool does the same lazily:
# the engine hands a cache back when its generation ends and the next link writes into the
# same pages. On CUDA a released cache may still be read by kernels queued on some stream, and
# the host does not wait for them: each release records an event on the releasing stream, and
# the next user's stream waits for it before its first kernel touches the memory (a device-side
# wait), as torch's caching allocator does with ``record_stream``.

Slabs = tuple[torch.Tensor, torch.Tensor]
# (slabs, event recorded at release or None): the event says when queued kernels are done with them
Idle = tuple[Slabs, Any]


def cuda_release_event(device: torch.device) -> Any:
    """An event recorded now on ``device``'s current stream (None off CUDA: nothing is queued)."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


def cuda_wait(event: Any, device: torch.device) -> None:
    """Make ``device``'s current stream wait for ``event`` (no host block)."""
    if event is not None:
        torch.cuda.current_stream(device).wait_event(event)


class SlabPool:
    """Idle ``(L, 1, H_kv, capacity, D)`` K/V slab pairs, handed out for caches of at most that capacity.

    Thread-safe. Keeps at most ``max_idle`` idle pairs (the largest ones), so its memory is
    bounded by the biggest recent requests; ``clear()`` drops them. ``release`` takes no
    lock (a deque append is atomic), so it is safe from a generator's ``finally`` that the
    garbage collector runs in the middle of another pool call.
    """

    def __init__(self, max_idle: int = 1, *, record: Callable[[torch.device], Any] = cuda_release_event,
                 wait: Callable[[Any, torch.device], None] = cuda_wait):
        """``record(device)`` / ``wait(event, device)``: the stream bookkeeping (CUDA events by
        default; injectable so the ordering can be tested on any device)."""
        self.max_idle = max_idle
        self._record, self._wait = record, wait
        self._idle: list[Idle] = []  # guarded by _lock
        self._returned: collections.deque[Idle] = collections.deque()
        self._lock = threading.Lock()

    def cache(self, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int, *,
              dtype: torch.dtype, device: torch.device) -> LinkedCache:
        """A :class:`LinkedCache` of ``capacity`` rows, on idle slabs when one fits."""
        want = (num_layers, 1, num_kv_heads, head_dim)
        device = normalize_device(device)  # "cuda" and "cuda:0" are one device
        with self._lock:
            self._take_returned()
            fits = [i for i, ((k, _), _) in enumerate(self._idle)
                    if k.dtype == dtype and k.device == device and k.shape[3] >= capacity
                    and (k.shape[0], k.shape[1], k.shape[2], k.shape[4]) == want]
            idle = self._idle.pop(min(fits, key=lambda i: self._idle[i][0][0].shape[3])) if fits else None
        slabs = None
        if idle is not None:
            slabs, event = idle
            self._wait(event, device)  # kernels of the previous user finish before ours touch it
        return LinkedCache(num_layers, num_kv_heads, head_dim, capacity, dtype=dtype, device=device, slabs=slabs)

    def release(self, cache: LinkedCache) -> None:
        """Take back a cache nobody reads any more; the cache is unusable afterwards."""
        slabs = cache.detach_slabs()
        if slabs is not None and self.max_idle > 0:
            self._returned.append((slabs, self._record(slabs[0].device)))

    def clear(self) -> None:
        with self._lock:
            self._returned.clear()
            self._idle.clear()

    @property
    def idle_bytes(self) -> int:
        with self._lock:
            self._take_returned()
            return sum(k.nbytes + v.nbytes for (k, v), _ in self._idle)

    def _take_returned(self) -> None:
        while self._returned:
            self._idle.append(self._returned.popleft())
        self._idle.sort(key=lambda s: s[0][0].shape[3], reverse=True)
        del self._idle[self.max_idle:]
