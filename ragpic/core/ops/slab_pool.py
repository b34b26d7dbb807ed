"""Reuse the memory of finished linked caches for the next request.

A linked cache is large (SmolLM2 at 4k tokens in fp32: 2 x 94 MB) and is written once per
request. On the CPU a fresh allocation of that size comes straight from the kernel, which
zero-fills every page on first touch: ~60 ms per 200 MB here, a tenth of a 4k-token
LegoLink link. Serving systems preallocate their KV memory for this reason; the pool does
the same lazily: the engine hands a cache back when its generation ends and the next link
writes into the same pages.

On CUDA a released cache may still be read by kernels queued on some stream (the last
decode step, a copy), and the host does not wait for them. Each release therefore records
an event on the releasing stream, and the next user's stream waits for that event before
its first kernel touches the memory (a device-side wait: the host never blocks), as torch's
caching allocator does with ``record_stream``.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

import torch

from ragpic.core.ops.device import normalize_device
from ragpic.core.ops.linked_cache import LinkedCache

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
