"""CatalogView and StoreCatalog: a ChunkStore's cached copy of its backend's catalog (``key -> chunk text``).

The engine searches these texts in every prompt given without hints, so reading the
backend's catalog on each query would cost a round trip (or a folder scan): the copy is
re-read after ``refresh_s`` or on demand, and kept up to date with this process's writes.
:class:`StoreCatalog` is what the store holds: that copy plus the backend calls that add,
remove and repair rows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

log = logging.getLogger("ragpic.cache")


class CatalogView:
    """``load()`` returns the backend's rows, or ``None`` when the backend cannot answer."""

    def __init__(self, load: Callable[[], Mapping[str, str] | None], refresh_s: float) -> None:
        self._load, self.refresh_s = load, refresh_s
        self._rows: dict[str, str] | None = None
        self._at = float("-inf")
        self._lock = threading.Lock()

    def rows(self, *, refresh: bool = False) -> dict[str, str]:
        """The cached rows, re-read first if asked, never read, or older than ``refresh_s``."""
        if refresh or self._rows is None or time.monotonic() - self._at > self.refresh_s:
            fresh = self._load()
            if fresh is not None:
                with self._lock:
                    self._rows, self._at = dict(fresh), time.monotonic()
        with self._lock:
            return dict(self._rows or {})

    def add(self, texts: Mapping[str, str]) -> None:
        with self._lock:
            if self._rows is not None:
                self._rows.update(texts)

    def forget(self, keys: Iterable[str]) -> None:
        with self._lock:
            if self._rows is not None:
                for key in keys:
                    self._rows.pop(key, None)


class StoreCatalog:
    """A store's catalog of one fingerprint: the backend's rows through a :class:`CatalogView`.

    Every backend call goes through ``call`` (the store's :class:`~ragpic.cache.guard.Guard`),
    so a failing backend leaves the cached rows as they were; ``count(repaired=n)`` counts rows
    put back by :meth:`repair`.
    """

    def __init__(self, backend: object, fingerprint: str, call: Callable[..., tuple[bool, object]],
                 count: Callable[..., None], refresh_s: float) -> None:
        self.backend, self.fingerprint, self._call, self._count = backend, fingerprint, call, count
        self.view = CatalogView(self._read, refresh_s)

    def _read(self) -> dict[str, str] | None:
        ok, rows = self._call("read", getattr(self.backend, "catalog", None), self.fingerprint)
        return dict(rows) if ok and rows is not None else None  # type: ignore[call-overload]

    def rows(self, *, refresh: bool = False) -> dict[str, str]:
        return self.view.rows(refresh=refresh)

    def add(self, texts: Mapping[str, str]) -> None:
        """Catalogue entries just stored (a backend that catalogues its own writes is not asked)."""
        if texts and not getattr(self.backend, "self_cataloguing", False):
            self._call("write", self.backend.catalog_add, self.fingerprint, texts)  # type: ignore[attr-defined]
        self.view.add(texts)

    def remove(self, keys: list[str]) -> None:
        """Drop rows of deleted entries, in the backend and here."""
        if keys and self.backend is not None:
            self._call("write", self.backend.catalog_remove, self.fingerprint, keys)  # type: ignore[attr-defined]
        self.view.forget(keys)

    def repair(self, stored: Mapping[str, str]) -> None:
        """Catalogue again the entries of ``stored`` (key -> text, all in the backend) that lost their row."""
        has = getattr(self.backend, "catalog_has", None)
        if has is None:  # a backend without row lookups: read its whole catalog
            known = self.rows(refresh=True)
            lost = {k: t for k, t in stored.items() if k not in known}
        else:
            keys = list(stored)
            ok, rows = self._call("read", has, self.fingerprint, keys)
            if not ok or rows is None:
                return
            lost = {k: stored[k] for k, hit in zip(keys, rows) if not hit}  # type: ignore[call-overload]
        if lost and self._call("write", self.backend.catalog_add, self.fingerprint, lost)[0]:  # type: ignore[attr-defined]
            log.warning("KV store: %d stored chunks were missing from the catalog; catalogued them again", len(lost))
            self._count(repaired=len(lost))
            self.view.add(lost)
