"""ChunkStore: the tiered KV store the engine reads and writes.

Reads go memory (decoded :class:`ChunkKV`, LRU with a byte budget) -> backend (entry
bytes, decoded and verified) -> miss (the engine recompiles and calls :meth:`put_many`).
Nothing a backend returns is trusted: an entry that fails to decode in any way, is filed
under another key, has a base position that is not its recipe's, or (given ``expect``)
does not match the model's shape or the tokenization of its text is corrupt: logged once,
deleted, counted in ``corrupt`` and reported as a miss.

A failing backend (disk full, unwritable folder, Redis down or stalled) is logged once per
kind of failure, counted in ``errors`` and skipped by a circuit breaker whose back-off
doubles from ``cooldown_s`` up to ``max_backoff_s`` (see :mod:`ragpic.cache.store.breaker`):
queries are then answered by recomputing instead of waiting or crashing. Ingest
(``put_many(strict=True)``, what ``RagPic.compile`` uses) instead raises a
:class:`ragpic.errors.StoreError` naming the chunk and the cause.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from ragpic.cache.backends.base import KVBackend
from ragpic.cache.format.entry import decode, encode, round_trip
from ragpic.core.kv_quant import parse_kv_quant
from ragpic.cache.format.expect import Expected
from ragpic.cache.store.breaker import Breaker
from ragpic.cache.store.catalog_view import StoreCatalog
from ragpic.cache.store.encoded import Encoded
from ragpic.cache.store.guard import Guard
from ragpic.cache.store.hot_tier import HotTier
from ragpic.cache.store.stats import StoreCounters, StoreStats, summary
from ragpic.cache.store.writes import put_to_backend
from ragpic.cache.store.write_errors import describe, write_error
from ragpic.core.kv import ChunkKV

log = logging.getLogger("ragpic.cache")

DEFAULT_MEMORY_BYTES = 512 * 2**20
_T = TypeVar("_T")


class ChunkStore:
    """Memory hot tier of decoded KV in front of an optional :class:`KVBackend`.

    Args:
        backend: where entry bytes persist; ``None`` keeps everything in memory only.
        fingerprint: model fingerprint; entries of other fingerprints are never returned.
        memory_bytes: budget of the hot tier (decoded KV bytes).
        quant: ``"none"`` (bit-exact), ``"int8"`` or ``"int4"`` for entries written by this store.
        verify_keys: check that a decoded entry's (text, recipe, dtype) hashes to its key.
        cooldown_s, max_backoff_s: the breaker's first and longest back-off after a failure.
        catalog_refresh_s: :meth:`texts` re-reads the backend catalog after this long.
        stats_interval_s: at most this often (on the next read or write), add this process's
            counts to the backend's shared counters and log them at INFO on ``ragpic.cache``
            (0: only on :meth:`close`).
    """

    def __init__(self, backend: KVBackend | None, *, fingerprint: str, memory_bytes: int = DEFAULT_MEMORY_BYTES,
                 quant: str = "none", verify_keys: bool = True, cooldown_s: float = 1.0,
                 max_backoff_s: float = 60.0, catalog_refresh_s: float = 30.0,
                 stats_interval_s: float = 300.0) -> None:
        quant = parse_kv_quant(quant, "quant")
        self.backend, self.fingerprint, self.quant, self.verify_keys = backend, fingerprint, quant, verify_keys
        self._guard = Guard(backend, Breaker(cooldown_s, max(cooldown_s, max_backoff_s)), self._count)
        self._counts = StoreCounters(stats_interval_s)
        self._catalog = StoreCatalog(backend, fingerprint, self._call, self._count, catalog_refresh_s)
        self._hot = HotTier(memory_bytes, backend, fingerprint, self._catalog, self._call, self._count)

    @property
    def breaker(self) -> Breaker:
        """The circuit breaker in front of the backend (replace it to change the back-off)."""
        return self._guard.breaker

    @breaker.setter
    def breaker(self, value: Breaker) -> None:
        self._guard.breaker = value

    def _count(self, **delta: int) -> None:
        self._counts.count(**delta)

    def _call(self, direction: str, fn: Callable[..., _T], *args: object) -> tuple[bool, _T | None]:
        return self._guard.call(direction, fn, *args)

    # -- reads -----------------------------------------------------------------------------------
    def get_many(self, keys: Sequence[str], *, expect: Expected | None = None) -> dict[str, ChunkKV]:
        """Verified KV for the keys that hit (memory first, then the backend; see
        :mod:`ragpic.cache.store.hot_tier`).

        ``expect`` (see :func:`ragpic.cache.format.expect.expected_for`) also holds each entry
        against the model's shape and the tokenization of its text.
        """
        found = self._hot.get_many(keys, expect, verify_keys=self.verify_keys)
        self._tick()
        return found

    def contains_many(self, keys: Sequence[str], texts: Sequence[str] | None = None) -> list[bool]:
        """Whether each key is stored (hot tier or backend), without reading or verifying it.

        A backend failure answers ``False`` (the engine then recompiles). With ``texts``
        (each key's chunk text), stored entries missing from the catalog are catalogued
        again: a compile of chunks that are stored but uncatalogued repairs the catalog.
        """
        out = [self._hot.holds(key) for key in keys]
        rest = [k for k, hit in zip(keys, out) if not hit and not self._hot.unreadable(k)]
        if rest and self.backend is not None:
            ok, found = self._call("read", self.backend.contains_many, rest)
            present = {k for k, hit in zip(rest, found or []) if hit} if ok else set()
            out = [hit or k in present for k, hit in zip(keys, out)]
            if texts is not None and present:
                self._catalog.repair({k: t for k, t in zip(keys, texts) if k in present})
        return out

    def texts(self, refresh: bool = False) -> dict[str, str]:
        """``key -> chunk text`` of every entry known for this fingerprint (cached catalog)."""
        hot = self._hot.texts()
        if self.backend is None:
            return hot
        merged = {k: t for k, t in self._catalog.rows(refresh=refresh).items() if not self._hot.unreadable(k)}
        merged.update(hot)
        return merged

    def candidates(self, prompt: str) -> list[str] | None:
        """Catalogued chunk texts that occur in ``prompt`` (exact slices of it, found through
        the catalog's anchor rows, see :mod:`ragpic.cache.store.text_match`); ``None`` when the
        backend cannot answer now (the caller then searches :meth:`texts`, the cached catalog)."""
        return self._catalog.candidates(prompt)

    def texts_of(self, keys: Sequence[str]) -> dict[str, str]:
        """``key -> text`` of the catalogued keys among ``keys`` (``{}`` when the backend fails)."""
        return {k: t for k, t in self._catalog.texts_of(keys).items() if not self._hot.unreadable(k)}

    # -- writes ----------------------------------------------------------------------------------
    def put_many(self, items: Mapping[str, tuple[ChunkKV, str]], *, strict: bool = False) -> list[str]:
        """Store ``key -> (kv, text)``; return the keys the backend (or memory) now holds:
        :meth:`encode_many` then :meth:`write`.

        Without ``strict`` a failed write is logged and skipped (a query must not fail).
        With ``strict`` (ingest) it raises, after cataloguing what was stored.

        Raises:
            StoreError: (``strict``) naming the first chunk not stored and the cause.
            ValueError: an item compiled for another fingerprint.
        """
        return self.write(self.encode_many(items, strict=strict), strict=strict)

    def encode_many(self, items: Mapping[str, tuple[ChunkKV, str]], *, strict: bool = False) -> Encoded:
        """The tensor half of :meth:`put_many`: each item as entry bytes (quantized as this store
        quantizes) and as a read returns it. Stores nothing. An item that cannot be encoded
        (inf/NaN under int8) raises with ``strict``, else is logged, counted and left out."""
        entries: dict[str, bytes] = {}
        forms: dict[str, ChunkKV] = {}
        for key, (kv, text) in items.items():
            if kv.fingerprint != self.fingerprint:
                raise ValueError(f"chunk {key} was compiled for {kv.fingerprint!r}, store is for {self.fingerprint!r}")
            try:
                entries[key] = data = encode(kv, text=text, quant=self.quant)
            except ValueError as exc:  # e.g. NaN KV under int8: don't store, don't fail the query
                if strict:
                    raise write_error(text, key, exc, 0, len(items)) from exc
                log.warning("KV entry %s not stored: %s", key, exc)
                self._count(errors=1)
                continue
            forms[key] = kv if self.quant == "none" else decode(data, fingerprint=self.fingerprint)[0]
        return Encoded(entries, forms, {k: items[k][1] for k in entries})

    def write(self, encoded: Encoded, *, strict: bool = False) -> list[str]:
        """The I/O half of :meth:`put_many` (no tensor math): ``encoded`` into the hot tier
        and the backend; the keys the backend (or memory) now holds."""
        for key, kv in encoded.read_form.items():
            self._hot.put_stored(key, (kv, encoded.texts[key], True))
        stored = list(encoded.entries) if self.backend is None else put_to_backend(
            self.backend, self._guard, self._catalog, dict(encoded.entries), encoded.texts, strict)
        written = sum(len(encoded.entries[k]) for k in stored) if self.backend else 0
        self._count(puts=len(stored), bytes_written=written, recompiles=0 if strict else len(stored))
        self._catalog.stored()
        self._tick()
        return stored

    def stored_form(self, key: str, kv: ChunkKV) -> ChunkKV:
        """``kv`` (just given to :meth:`put_many` under ``key``) as a read of its entry would
        return it. A query that compiled a missing chunk links this, so its answer is the one
        every later query that hits the entry gets.

        ``kv`` itself in exact storage; else the decoded entry :meth:`put_many` left in the
        hot tier (no second encode), or, if the hot tier has already let it go, the int8/int4
        round trip. A ``kv`` that could not be encoded (inf/NaN under int8) was not stored, so
        no read will ever differ from it: ``kv`` itself.
        """
        if self.quant == "none":
            return kv
        hit = self._hot.get(key)
        if hit is not None:
            return hit[0]
        try:
            return round_trip(kv, self.quant)
        except ValueError:
            return kv

    def delete_many(self, keys: Sequence[str]) -> list[str]:
        """Delete these entries (hot tier, backend, catalog); return the keys that were stored.
        (Added for ``ragpic serve``'s ``DELETE /v1/context_cache/{id}``.)"""
        present = [k for k, hit in zip(keys, self.contains_many(list(keys))) if hit]
        self._hot.drop(present)
        return present

    # -- bookkeeping -----------------------------------------------------------------------------
    def stats(self) -> StoreStats:
        """A snapshot of the counters."""
        return self._counts.snapshot()

    def reset_stats(self) -> None:
        self.flush_stats()  # the shared counters keep what this process counted so far
        self._counts.reset()

    def _tick(self) -> None:
        if self._counts.due():
            self.flush_stats()
            ok, figures = self._call("read", self.backend.stats) if self.backend else (False, None)
            log.info("%s", summary(self.stats(), figures if ok else None))

    def flush_stats(self) -> None:
        """Add what this process counted since the last flush to the backend's shared
        counters (what ``ragpic store stats`` shows); a no-op without a writable backend."""
        backend = self.backend
        if backend is not None and backend.writable:
            self._counts.flush(lambda delta: self._call("write", backend.add_counters, delta)[0])

    @property
    def memory_bytes(self) -> int:
        """Bytes the hot tier holds now (at most its budget, ``memory_cache_mb``)."""
        return self._hot.nbytes

    def clear_memory(self) -> None:
        """Drop the hot tier (the backend keeps its entries; a memory-only store forgets them)."""
        self._hot.clear()
        self._catalog.hot_cleared()

    def close(self) -> None:
        self.flush_stats()
        self._hot.clear()
        if self.backend is not None:
            try:
                self.backend.close()
            except Exception as exc:
                log.debug("KV store close failed: %s", describe(exc))

    def __enter__(self) -> "ChunkStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
