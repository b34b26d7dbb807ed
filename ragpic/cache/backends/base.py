"""KVBackend: what :class:`ragpic.cache.store.ChunkStore` needs from a storage medium.

A backend stores opaque entry bytes (see :mod:`ragpic.cache.format.entry`) under content keys
(see :mod:`ragpic.cache.format.keys`); it never decodes a payload. Beside the entries it keeps
one *catalog* per model fingerprint, ``key -> chunk text`` plus each text's anchor row (see
:mod:`ragpic.cache.format.anchors`), which lets the engine find stored chunks in a prompt after
a restart. The catalog changes with the entries: a row is written with its entry, and removed
when the entry is evicted or dropped, in the same transaction where the medium has them
(docs/ARCHITECTURE.md §2). Implementations: :mod:`.memory`, :mod:`.disk`, :mod:`.redis`.

The abstract methods are the medium's; the others have defaults built on them, which a
backend overrides when its medium does better (one round trip, an index). Backends may raise
whatever their medium raises (``OSError``, ``sqlite3.Error``, ``redis.RedisError``); the store
catches it. This module imports no implementation.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

from ragpic.cache.format.anchors import ANCHOR, Posting, posting_of


class KVBackend(abc.ABC):
    """Bytes store keyed by content hash, plus the per-fingerprint catalog of chunk texts."""

    #: ``put_many`` writes the catalog rows of what it stores (from the entry headers); a
    #: backend that does not has them added by the store through :meth:`catalog_add`.
    self_cataloguing: bool = False
    #: whether writes can succeed (a read-only folder serves reads only).
    writable: bool = True

    # -- the medium ------------------------------------------------------------------------
    @abc.abstractmethod
    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """Entry bytes for each key, ``None`` where absent; same order as ``keys``."""

    @abc.abstractmethod
    def put_many(self, items: Mapping[str, bytes], *, patient: bool = False) -> None:
        """Store each entry; each one is atomic (fully readable or absent). ``patient``
        (ingest): wait longer on a slow medium rather than fail fast. After a failure,
        :meth:`contains_many` tells which entries of the batch were stored."""

    @abc.abstractmethod
    def contains(self, key: str) -> bool: ...

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove an entry and its catalog rows (no error if absent)."""

    @abc.abstractmethod
    def stats(self) -> dict[str, Any]:
        """Backend-specific figures (entries, bytes, limits...)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def catalog(self, fingerprint: str) -> dict[str, str]:
        """``key -> chunk text`` of this fingerprint's entries that are still stored."""

    @abc.abstractmethod
    def catalog_add(self, fingerprint: str, items: Mapping[str, str]) -> None:
        """Catalogue stored entries (a repair, or the store's rows for a backend that is not
        :attr:`self_cataloguing`); keys not stored are ignored."""

    @abc.abstractmethod
    def catalog_remove(self, fingerprint: str, keys: Sequence[str]) -> None: ...

    # -- defaults ----------------------------------------------------------------------------
    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is stored (one :meth:`contains` per key unless overridden)."""
        return [self.contains(k) for k in keys]

    def drop(self, fingerprint: str, keys: Sequence[str]) -> None:
        """Delete entries and their catalog rows (the store drops corrupt or unwanted ones)."""
        for key in keys:
            self.delete(key)
        self.catalog_remove(fingerprint, keys)

    def catalog_has(self, fingerprint: str, keys: Sequence[str]) -> list[bool]:
        """Whether each key has a catalog row. The default reads the whole catalog; the
        builtin backends read only those rows (``compile()`` of a stored corpus asks this)."""
        rows = self.catalog(fingerprint)
        return [k in rows for k in keys]

    def catalog_texts(self, fingerprint: str, keys: Sequence[str]) -> dict[str, str]:
        """``key -> text`` of the catalogued keys among ``keys``."""
        rows = self.catalog(fingerprint)
        return {k: rows[k] for k in keys if k in rows}

    def anchor_lookup(self, fingerprint: str, anchors: Sequence[str]) -> dict[str, list[Posting]]:
        """The catalogued chunks under each anchor, ``{anchor: [Posting]}`` (anchors without
        one are left out). The default derives them from the whole catalog, O(store); the
        builtin backends keep the rows and answer in one lookup."""
        wanted, out = set(anchors), {}
        for key, text in self.catalog(fingerprint).items():
            anchor, post = posting_of(key, text)
            if anchor in wanted:  # a short text's anchor is the hash of its whole text
                out.setdefault(anchor, []).append(post)
        return out

    def short_lengths(self, fingerprint: str) -> set[int]:
        """Distinct lengths of catalogued chunks shorter than the anchor (probed whole)."""
        return {len(t) for t in self.catalog(fingerprint).values() if len(t) < ANCHOR}

    def is_unreachable(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the medium cannot be reached at all (reads and writes both
        down); the store's breaker then opens both directions. Builtin timeouts always count."""
        return isinstance(exc, (TimeoutError, ConnectionError))

    def add_counters(self, deltas: Mapping[str, int]) -> None:
        """Add a process's counts to the medium's shared counters (``ragpic store stats``);
        a medium without any keeps nothing."""

    def counters(self) -> dict[str, int]:
        """What every process using this medium counted (``{}`` without shared counters)."""
        return {}
