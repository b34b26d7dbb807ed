"""A thread-safe LRU map with a byte budget, shared by the memory backend and the hot tier."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

V = TypeVar("V")


class ByteLRU(Generic[V]):
    """``str -> V`` map holding at most ``max_bytes`` (as measured by ``size_of``).

    Inserting evicts least recently used entries until the total fits; a single value
    larger than the whole budget is not stored at all. ``get`` refreshes recency.
    All methods take one lock, so instances can be shared between threads.
    """

    def __init__(self, max_bytes: int, size_of: Callable[[V], int]) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self._size_of = size_of
        self._items: OrderedDict[str, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._evictions = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> V | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            self._items.move_to_end(key)
            return hit[0]

    def put(self, key: str, value: V) -> list[str]:
        """Store ``value``; return the keys evicted to make room (``key`` itself if too big)."""
        size = int(self._size_of(value))
        with self._lock:
            evicted: list[str] = []
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if size > self.max_bytes:
                return [key]
            while self._bytes + size > self.max_bytes and self._items:
                k, (_, s) = self._items.popitem(last=False)
                self._bytes -= s
                self._evictions += 1
                evicted.append(k)
            self._items[key] = (value, size)
            self._bytes += size
            return evicted

    def pop(self, key: str) -> V | None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is None:
                return None
            self._bytes -= old[1]
            return old[0]

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._items)

    def items(self) -> list[tuple[str, V]]:
        with self._lock:
            return [(k, v) for k, (v, _) in self._items.items()]

    def discard_many(self, keys: Iterable[str]) -> None:
        with self._lock:
            for k in keys:
                old = self._items.pop(k, None)
                if old is not None:
                    self._bytes -= old[1]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    @property
    def evictions(self) -> int:
        return self._evictions
