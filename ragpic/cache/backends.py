"""The storage protocol behind :class:`ragpic.cache.store.ChunkStore`, and its memory backend.

A backend stores opaque entry bytes (see :mod:`ragpic.cache.entry`) under content keys
(see :mod:`ragpic.cache.keys`); it never decodes them. Besides the six storage methods it
keeps a small *catalog*, ``(fingerprint, key) -> chunk text``, that lets the engine find
cached chunks inside a prompt after a restart. Implementations:

- :class:`MemoryBackend` (here): thread-safe LRU with a byte budget;
- :class:`ragpic.cache.disk.DiskBackend`: entry files + SQLite index, process-safe, size-limited;
- :class:`ragpic.cache.redis_backend.RedisBackend`: shared Redis server (needs ``redis``).

Backends may raise whatever their medium raises (``OSError``, ``sqlite3.Error``,
``redis.RedisError``); the store catches it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ragpic.cache.disk import DiskBackend
from ragpic.cache.lru import ByteLRU

if TYPE_CHECKING:
    from ragpic.cache.redis_backend import RedisBackend

__all__ = ["KVBackend", "MemoryBackend", "DiskBackend", "RedisBackend"]


@runtime_checkable
class KVBackend(Protocol):
    """Bytes store keyed by content hash, plus the per-fingerprint text catalog."""

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """Entry bytes for each key, ``None`` where absent; same order as ``keys``."""
        ...

    def put_many(self, items: Mapping[str, bytes]) -> None:
        """Store each entry; each one is atomic (fully readable or absent). A backend may
        also take ``patient=True`` (ingest: wait longer rather than fail fast); after a
        failure, ``contains`` must tell which entries of the batch were stored."""
        ...

    def contains(self, key: str) -> bool: ...

    def delete(self, key: str) -> None:
        """Remove an entry (no error if absent)."""
        ...

    def stats(self) -> dict[str, Any]:
        """Backend-specific figures (entries, bytes, limits...)."""
        ...

    def close(self) -> None: ...

    def catalog(self, fingerprint: str) -> dict[str, str]:
        """``key -> chunk text`` of this fingerprint's entries that are still stored."""
        ...

    def catalog_add(self, fingerprint: str, items: Mapping[str, str]) -> None: ...

    def catalog_remove(self, fingerprint: str, keys: Sequence[str]) -> None: ...

    def catalog_has(self, fingerprint: str, keys: Sequence[str]) -> list[bool]:
        """Whether each key has a catalog row, reading only those rows (never the whole
        catalog): ``compile()`` of a stored corpus checks its keys with this, in batches.
        Optional: without it the store reads the whole catalog instead."""
        ...


class MemoryBackend:
    """In-process LRU of entry bytes holding at most ``max_bytes`` of payload."""

    def __init__(self, max_bytes: int) -> None:
        self._lru: ByteLRU[bytes] = ByteLRU(max_bytes, len)
        self._catalogs: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [self._lru.get(k) for k in keys]

    def put_many(self, items: Mapping[str, bytes]) -> None:
        for key, value in items.items():
            self._lru.put(key, bytes(value))

    def contains(self, key: str) -> bool:
        return key in self._lru

    def delete(self, key: str) -> None:
        self._lru.pop(key)

    def stats(self) -> dict[str, Any]:
        return {"backend": "memory", "entries": len(self._lru), "bytes": self._lru.nbytes,
                "max_bytes": self._lru.max_bytes, "evictions": self._lru.evictions}

    def close(self) -> None:
        self._lru.clear()
        with self._lock:
            self._catalogs.clear()

    def catalog(self, fingerprint: str) -> dict[str, str]:
        with self._lock:
            rows = self._catalogs.get(fingerprint, {})
            for k in [k for k in rows if k not in self._lru]:
                del rows[k]
            return dict(rows)

    def catalog_add(self, fingerprint: str, items: Mapping[str, str]) -> None:
        with self._lock:
            self._catalogs.setdefault(fingerprint, {}).update(items)

    def catalog_remove(self, fingerprint: str, keys: Sequence[str]) -> None:
        with self._lock:
            rows = self._catalogs.get(fingerprint, {})
            for k in keys:
                rows.pop(k, None)

    def catalog_has(self, fingerprint: str, keys: Sequence[str]) -> list[bool]:
        with self._lock:
            rows = self._catalogs.get(fingerprint, {})
            return [k in rows for k in keys]


def __getattr__(name: str) -> Any:
    if name == "RedisBackend":  # imported lazily: redis-py is an optional dependency
        from ragpic.cache.redis_backend import RedisBackend

        return RedisBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
