"""HotTier: a ChunkStore's read path — decoded KV in memory, read through to the backend.

A read looks in memory first (decoded :class:`ChunkKV`, LRU with a byte budget), then asks
the backend for the rest, in one call. Nothing a backend returns is trusted: every entry is
verified (:func:`ragpic.cache.format.expect.verify_entry`) before it enters the tier, and an
entry that fails is logged once, dropped with its catalog row and counted in ``corrupt``;
one the backend cannot delete is never read again. A memory-only store's catalog follows
the tier (``StoreCatalog.hot_put``), so its texts leave prompt matching with their entries
(docs/ARCHITECTURE.md §2).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from ragpic.cache.backends.base import KVBackend
from ragpic.cache.backends.lru import ByteLRU
from ragpic.cache.format.entry import CorruptEntry
from ragpic.cache.format.expect import Expected, check_expected, verify_entry
from ragpic.cache.store.catalog_view import StoreCatalog
from ragpic.core.kv import ChunkKV

log = logging.getLogger("ragpic.cache")

#: ``(kv, text, checked)``: ``checked`` once the entry was held against an ``expect``.
HotItem = tuple[ChunkKV, str, bool]


def _hot_size(item: HotItem) -> int:
    kv, text, _ = item
    return kv.nbytes + kv.token_ids.numel() * 8 + len(text)


class HotTier:
    """Decoded entries in memory in front of ``backend`` (``None``: memory only).

    ``call`` is the store's guarded backend call (:class:`~ragpic.cache.store.guard.Guard`),
    ``count`` its counters (:class:`~ragpic.cache.store.stats.StoreCounters`).
    """

    def __init__(self, memory_bytes: int, backend: KVBackend | None, fingerprint: str, catalog: StoreCatalog,
                 call: Callable[..., tuple[bool, object]], count: Callable[..., None]) -> None:
        self.backend, self.fingerprint, self._catalog = backend, fingerprint, catalog
        self._call, self._count = call, count
        self._lru: ByteLRU[HotItem] = ByteLRU(memory_bytes, _hot_size)
        self._bad: set[str] = set()  # corrupt entries the backend could not delete: never re-read

    # -- what the tier holds ---------------------------------------------------------------------
    def get(self, key: str) -> HotItem | None:
        return self._lru.get(key)

    def holds(self, key: str) -> bool:
        """In memory and readable."""
        return key in self._lru and key not in self._bad

    def unreadable(self, key: str) -> bool:
        """A corrupt entry the backend could not delete: answered as a miss, never read."""
        return key in self._bad

    @property
    def nbytes(self) -> int:
        """Bytes the tier holds (decoded KV, ids and texts; at most its budget)."""
        return self._lru.nbytes

    def texts(self) -> dict[str, str]:
        """``key -> text`` of the entries in memory."""
        return {k: t for k, (_, t, _) in self._lru.items()}

    def put(self, key: str, item: HotItem) -> None:
        self._catalog.hot_put(key, item[1], self._lru.put(key, item))

    def put_stored(self, key: str, item: HotItem) -> None:
        """An entry this process just wrote: in memory, and readable again if it was not."""
        self.put(key, item)
        self._bad.discard(key)

    def clear(self) -> None:
        """Empty the memory (the catalog is the caller's: see ``StoreCatalog.hot_cleared``)."""
        self._lru.clear()

    # -- the read path -----------------------------------------------------------------------------
    def get_many(self, keys: Sequence[str], expect: Expected | None, *, verify_keys: bool) -> dict[str, ChunkKV]:
        """Verified KV for the keys that hit (memory first, then the backend); the rest are
        counted as misses. ``verify_keys``: see :class:`~ragpic.cache.store.ChunkStore`."""
        found: dict[str, ChunkKV] = {}
        missing: list[str] = []
        bad: list[str] = []
        unique = list(dict.fromkeys(keys))
        for key in unique:
            hit = self._lru.get(key)
            if hit is not None and not hit[2] and expect is not None:
                hit = self._checked(key, hit, expect, bad)
            if hit is not None:
                found[key] = hit[0]
            elif key not in bad and key not in self._bad:
                missing.append(key)
        self._count(memory_hits=len(found), misses=len(unique) - len(found) - len(missing))
        if missing:
            ok, payloads = self._call("read", self.backend.get_many, missing) if self.backend else (False, None)
            for key, data in zip(missing, payloads if ok and payloads else [None] * len(missing)):
                kv = self._load(key, data, expect, verify_keys, bad) if data is not None else None
                if kv is None:
                    self._count(misses=1)
                else:
                    found[key] = kv
        self.drop(bad)
        return found

    def _load(self, key: str, data: bytes, expect: Expected | None, verify_keys: bool,
              bad: list[str]) -> ChunkKV | None:
        try:
            kv, text = verify_entry(key, data, fingerprint=self.fingerprint, verify_key=verify_keys, expect=expect)
        except CorruptEntry as exc:
            return self._corrupt(key, exc, bad)
        self._count(backend_hits=1, bytes_read=len(data))
        self.put(key, (kv, text, expect is not None))
        return kv

    def _checked(self, key: str, hit: HotItem, expect: Expected, bad: list[str]) -> HotItem | None:
        """A hot entry read without ``expect`` is checked the first time one is given."""
        try:
            check_expected(hit[0], hit[1], expect)
        except CorruptEntry as exc:
            return self._corrupt(key, exc, bad)
        checked = (hit[0], hit[1], True)
        self.put(key, checked)
        return checked

    def _corrupt(self, key: str, exc: CorruptEntry, bad: list[str]) -> None:
        log.warning("KV entry %s is unusable and was dropped: %s", key, exc)
        self._count(corrupt=1)
        bad.append(key)

    def drop(self, keys: list[str]) -> None:
        """Delete entries with their catalog rows (texts leave matching with them); the
        ones the backend cannot delete are never read again."""
        if not keys:
            return
        self._lru.discard_many(keys)
        if not self._catalog.drop(keys):
            self._bad.update(keys)
