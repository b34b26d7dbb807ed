"""ChunkStore: the tiered KV store the engine reads and writes.

Reads go memory (decoded :class:`ChunkKV`, LRU with a byte budget) -> backend (entry
bytes, decoded and verified) -> miss (the engine recompiles and calls :meth:`put_many`).
Nothing a backend returns is trusted: a truncated, bit-flipped, misfiled or foreign entry
is logged, deleted, counted in ``corrupt`` and reported as a miss. A failing backend (disk
full, unwritable folder, Redis down) is logged once per kind of failure, counted in
``errors`` and skipped for ``cooldown_s`` seconds; the store then behaves as a cache that
misses, so a query is answered by recomputing instead of crashing.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ragpic.cache.backends import DiskBackend, KVBackend
from ragpic.cache.disk import DEFAULT_SIZE_LIMIT
from ragpic.cache.entry import QUANTS, CorruptEntry, ForeignEntry, decode, encode
from ragpic.cache.keys import chunk_key
from ragpic.cache.lru import ByteLRU
from ragpic.core.kv import ChunkKV

log = logging.getLogger("ragpic.cache")

DEFAULT_MEMORY_BYTES = 512 * 2**20
_T = TypeVar("_T")


@dataclass(slots=True)
class StoreStats:
    """Counters since creation or :meth:`ChunkStore.reset_stats` (one per looked-up key)."""

    memory_hits: int = 0
    backend_hits: int = 0
    misses: int = 0
    corrupt: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    errors: int = 0
    puts: int = 0

    @property
    def hits(self) -> int:
        return self.memory_hits + self.backend_hits

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


def _hot_size(item: tuple[ChunkKV, str]) -> int:
    kv, text = item
    return kv.nbytes + kv.token_ids.numel() * 8 + len(text)


class ChunkStore:
    """Memory hot tier of decoded KV in front of an optional :class:`KVBackend`.

    Args:
        backend: where entry bytes persist; ``None`` keeps everything in memory only.
        fingerprint: model fingerprint; entries of other fingerprints are never returned.
        memory_bytes: budget of the hot tier (decoded KV bytes).
        quant: ``"none"`` (bit-exact) or ``"int8"`` for entries written by this store. The
            hot tier holds what a backend read would return, so results don't depend on
            which tier answered.
        verify_keys: check that a decoded entry's (text, recipe, dtype) hashes to the key it
            was stored under (catches entries copied or swapped between keys).
        cooldown_s: after a backend failure, skip that direction (read/write) this long.
        catalog_refresh_s: :meth:`texts` re-reads the backend catalog after this long, so
            chunks written by other processes show up.
    """

    def __init__(self, backend: KVBackend | None, *, fingerprint: str, memory_bytes: int = DEFAULT_MEMORY_BYTES,
                 quant: str = "none", verify_keys: bool = True, cooldown_s: float = 2.0,
                 catalog_refresh_s: float = 30.0) -> None:
        if quant not in QUANTS:
            raise ValueError(f"unknown quant {quant!r}: expected one of {QUANTS}")
        self.backend = backend
        self.fingerprint = fingerprint
        self.quant = quant
        self.verify_keys = verify_keys
        self.cooldown_s = cooldown_s
        self.catalog_refresh_s = catalog_refresh_s
        self._hot: ByteLRU[tuple[ChunkKV, str]] = ByteLRU(memory_bytes, _hot_size)
        self._stats = StoreStats()
        self._lock = threading.Lock()
        self._warned: set[tuple[str, str]] = set()
        self._down_until: dict[str, float] = {}
        self._catalog: dict[str, str] | None = None
        self._catalog_at = 0.0

    # -- failure handling ----------------------------------------------------------------------
    def _count(self, **delta: int) -> None:
        with self._lock:
            for name, n in delta.items():
                setattr(self._stats, name, getattr(self._stats, name) + n)

    def _call(self, direction: str, fn: Callable[..., _T], *args: object) -> tuple[bool, _T | None]:
        """Run a backend call; on any exception log (once per kind), count, cool down."""
        if self.backend is None or time.monotonic() < self._down_until.get(direction, 0.0):
            return False, None
        try:
            return True, fn(*args)
        except Exception as exc:  # a cache failure must never fail the query
            self._count(errors=1)
            self._down_until[direction] = time.monotonic() + self.cooldown_s
            kind = (getattr(fn, "__name__", "call"), type(exc).__name__)
            level = logging.DEBUG if kind in self._warned else logging.WARNING
            self._warned.add(kind)
            log.log(level, "KV store %s failed (%s: %s); treating as a miss / skipping the write",
                    kind[0], kind[1], exc)
            return False, None

    # -- reads -----------------------------------------------------------------------------------
    def get_many(self, keys: Sequence[str]) -> dict[str, ChunkKV]:
        """Verified KV for the keys that hit (memory first, then the backend)."""
        found: dict[str, ChunkKV] = {}
        missing: list[str] = []
        for key in dict.fromkeys(keys):
            hit = self._hot.get(key)
            if hit is not None:
                found[key] = hit[0]
            else:
                missing.append(key)
        self._count(memory_hits=len(found))
        if not missing:
            return found
        ok, payloads = self._call("read", self.backend.get_many if self.backend else None, missing)  # type: ignore[arg-type]
        if not ok or payloads is None:
            self._count(misses=len(missing))
            return found
        bad: list[str] = []
        for key, data in zip(missing, payloads):
            if data is None:
                self._count(misses=1)
                continue
            try:
                kv, text = decode(data, fingerprint=self.fingerprint)
                if self.verify_keys and chunk_key(self.fingerprint, text, kv.recipe, kv.keys.dtype) != key:
                    raise CorruptEntry("entry holds another chunk than its key names (misfiled)")
            except (CorruptEntry, ForeignEntry) as exc:
                log.warning("KV entry %s is unusable and was dropped: %s", key, exc)
                self._count(corrupt=1, misses=1)
                bad.append(key)
                continue
            found[key] = kv
            self._count(backend_hits=1, bytes_read=len(data))
            self._hot.put(key, (kv, text))
        for key in bad:
            self._call("write", self.backend.delete, key)  # type: ignore[union-attr]
        if bad:
            self._forget(bad)
        return found

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is stored (hot tier or backend), without reading or verifying it.

        A backend failure answers ``False`` (the engine then recompiles). A corrupt entry
        answers ``True`` here and is caught, deleted and recompiled on :meth:`get_many`.
        """
        out = [key in self._hot for key in keys]
        rest = [k for k, hit in zip(keys, out) if not hit]
        if rest and self.backend is not None:
            backend = self.backend

            def contains_many(ks: list[str]) -> list[bool]:
                many = getattr(backend, "contains_many", None)
                return list(many(ks)) if many is not None else [backend.contains(k) for k in ks]

            ok, found = self._call("read", contains_many, rest)
            present = {k for k, hit in zip(rest, found or []) if hit} if ok else set()
            out = [hit or k in present for k, hit in zip(keys, out)]
        return out

    def _forget(self, keys: list[str]) -> None:
        self._call("write", self.backend.catalog_remove, self.fingerprint, keys)  # type: ignore[union-attr]
        with self._lock:
            if self._catalog is not None:
                for key in keys:
                    self._catalog.pop(key, None)

    def texts(self, refresh: bool = False) -> dict[str, str]:
        """``key -> chunk text`` of every entry known for this fingerprint (cached catalog)."""
        hot = {k: t for k, (_, t) in self._hot.items()}
        if self.backend is None:
            return hot
        stale = time.monotonic() - self._catalog_at > self.catalog_refresh_s
        if refresh or self._catalog is None or stale:
            ok, rows = self._call("read", self.backend.catalog, self.fingerprint)
            if ok and rows is not None:
                with self._lock:
                    self._catalog, self._catalog_at = dict(rows), time.monotonic()
        with self._lock:
            merged = dict(self._catalog or {})
        merged.update(hot)
        return merged

    # -- writes ----------------------------------------------------------------------------------
    def put_many(self, items: Mapping[str, tuple[ChunkKV, str]]) -> None:
        """Store ``key -> (kv, text)``; a failed backend write is logged and skipped."""
        encoded: dict[str, bytes] = {}
        for key, (kv, text) in items.items():
            if kv.fingerprint != self.fingerprint:
                raise ValueError(f"chunk {key} was compiled for {kv.fingerprint!r}, store is for {self.fingerprint!r}")
            try:
                data = encode(kv, text=text, quant=self.quant)
            except ValueError as exc:  # e.g. NaN KV under int8: don't store, don't fail the query
                log.warning("KV entry %s not stored: %s", key, exc)
                self._count(errors=1)
                continue
            encoded[key] = data
            hot_kv = kv if self.quant == "none" else decode(data, fingerprint=self.fingerprint)[0]
            self._hot.put(key, (hot_kv, text))
        if self.backend is None:
            self._count(puts=len(encoded))
            return
        ok, _ = self._call("write", self.backend.put_many, encoded)
        if not ok:
            return
        self._count(puts=len(encoded), bytes_written=sum(len(d) for d in encoded.values()))
        new_texts = {k: items[k][1] for k in encoded}
        self._call("write", self.backend.catalog_add, self.fingerprint, new_texts)
        with self._lock:
            if self._catalog is not None:
                self._catalog.update(new_texts)

    # -- bookkeeping -----------------------------------------------------------------------------
    def stats(self) -> StoreStats:
        """A snapshot of the counters."""
        with self._lock:
            return dataclasses.replace(self._stats)

    def reset_stats(self) -> None:
        with self._lock:
            self._stats = StoreStats()

    def clear_memory(self) -> None:
        """Drop the hot tier (the backend keeps its entries)."""
        self._hot.clear()

    def close(self) -> None:
        self._hot.clear()
        if self.backend is not None:
            self._call("write", self.backend.close)

    def __enter__(self) -> "ChunkStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_store(spec: str | os.PathLike[str] | None, *, fingerprint: str, memory_bytes: int = DEFAULT_MEMORY_BYTES,
               size_limit_bytes: int = DEFAULT_SIZE_LIMIT, quant: str = "none", recipes: Sequence[str] = (),
               redis_ttl_s: float | None = None) -> ChunkStore:
    """Open a store from a spec: ``None``/``"memory"`` (memory only), ``"redis://..."``
    (:class:`RedisBackend`), anything else a folder (:class:`DiskBackend`).

    A folder that cannot be created or opened (unwritable, disk full) degrades to a
    memory-only store with a warning and ``errors == 1``; the engine keeps working.
    """
    kwargs = dict(fingerprint=fingerprint, memory_bytes=memory_bytes, quant=quant)
    if spec is None or str(spec) == "memory":
        return ChunkStore(None, **kwargs)  # type: ignore[arg-type]
    text = os.fspath(spec)
    if isinstance(text, str) and text.startswith(("redis://", "rediss://")):
        from ragpic.cache.redis_backend import RedisBackend

        return ChunkStore(RedisBackend(text, ttl_s=redis_ttl_s), **kwargs)  # type: ignore[arg-type]
    try:
        backend = DiskBackend(text, size_limit_bytes, fingerprint=fingerprint, recipes=recipes)
    except (OSError, sqlite3.Error) as exc:
        log.warning("KV store folder %s is unusable (%s: %s); caching in memory only", text, type(exc).__name__, exc)
        store = ChunkStore(None, **kwargs)  # type: ignore[arg-type]
        store._count(errors=1)
        return store
    return ChunkStore(backend, **kwargs)  # type: ignore[arg-type]
