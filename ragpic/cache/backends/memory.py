"""MemoryBackend: entry bytes in process memory, an LRU with a byte budget.

Its catalog rows live under the same lock as the entries: an entry the LRU evicts, or one
deleted, takes its row (text and anchor) with it, and a row is only added for a stored entry.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ragpic.cache.backends.base import KVBackend
from ragpic.cache.backends.lru import ByteLRU
from ragpic.cache.backends.text_rows import TextRows
from ragpic.cache.format.anchors import Posting


class MemoryBackend(KVBackend):
    """In-process LRU of entry bytes holding at most ``max_bytes`` of payload."""

    def __init__(self, max_bytes: int) -> None:
        self._lru: ByteLRU[bytes] = ByteLRU(max_bytes, len)
        self._catalogs: dict[str, TextRows] = {}
        self._lock = threading.Lock()

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [self._lru.get(k) for k in keys]

    def put_many(self, items: Mapping[str, bytes], *, patient: bool = False) -> None:
        with self._lock:
            for key, value in items.items():
                self._forget(self._lru.put(key, bytes(value)))  # evicted (or the key itself, too big)

    def _forget(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        if keys:
            for rows in self._catalogs.values():
                rows.remove(keys)

    def contains(self, key: str) -> bool:
        return key in self._lru

    def delete(self, key: str) -> None:
        with self._lock:
            self._lru.pop(key)
            self._forget([key])

    def stats(self) -> dict[str, Any]:
        return {"backend": "memory", "entries": len(self._lru), "bytes": self._lru.nbytes,
                "max_bytes": self._lru.max_bytes, "evictions": self._lru.evictions}

    def close(self) -> None:
        with self._lock:
            self._lru.clear()
            self._catalogs.clear()

    def _rows(self, fingerprint: str) -> TextRows:
        return self._catalogs.setdefault(fingerprint, TextRows())

    def catalog(self, fingerprint: str) -> dict[str, str]:
        with self._lock:
            return self._rows(fingerprint).rows()

    def catalog_add(self, fingerprint: str, items: Mapping[str, str]) -> None:
        with self._lock:
            self._rows(fingerprint).add({k: t for k, t in items.items() if k in self._lru})

    def catalog_remove(self, fingerprint: str, keys: Sequence[str]) -> None:
        with self._lock:
            self._rows(fingerprint).remove(keys)

    def catalog_has(self, fingerprint: str, keys: Sequence[str]) -> list[bool]:
        with self._lock:
            rows = self._rows(fingerprint)
            return [k in rows for k in keys]

    def catalog_texts(self, fingerprint: str, keys: Sequence[str]) -> dict[str, str]:
        with self._lock:
            return self._rows(fingerprint).texts(keys)

    def anchor_lookup(self, fingerprint: str, anchors: Sequence[str]) -> dict[str, list[Posting]]:
        with self._lock:
            return self._rows(fingerprint).lookup(anchors)

    def short_lengths(self, fingerprint: str) -> set[int]:
        with self._lock:
            return self._rows(fingerprint).short_lengths()
