"""CatalogView and StoreCatalog: a ChunkStore's cached copy of its backend's catalog (``key -> chunk text``)
and the prompt matching over the catalog's anchor rows.

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
from collections.abc import Callable, Iterable, Mapping, Sequence

from ragpic.cache.backends.base import KVBackend
from ragpic.cache.store.hot_texts import HotTexts
from ragpic.cache.store.text_match import TextMatcher

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
    """A store's catalog of one fingerprint: the backend's rows through a :class:`CatalogView`,
    and the prompt matching over them (:mod:`.text_match`).

    Every backend call goes through ``call`` (the store's :class:`~ragpic.cache.store.guard.Guard`),
    so a failing backend leaves the cached rows as they were; ``count(repaired=n)`` counts rows
    put back by :meth:`repair`. A memory-only store's catalog is its hot tier (:class:`HotTexts`):
    its texts leave matching when the tier lets their entries go.
    """

    def __init__(self, backend: KVBackend | None, fingerprint: str, call: Callable[..., tuple[bool, object]],
                 count: Callable[..., None], refresh_s: float) -> None:
        self.backend, self.fingerprint, self._call, self._count = backend, fingerprint, call, count
        self.view = CatalogView(self._read, refresh_s)
        self._hot = HotTexts() if backend is None else None
        self._matcher = self._hot.matcher() if self._hot is not None else TextMatcher(
            lambda anchors: backend.anchor_lookup(fingerprint, anchors),  # type: ignore[union-attr]
            lambda: backend.short_lengths(fingerprint))  # type: ignore[union-attr]

    # -- prompt matching -----------------------------------------------------------------------
    def candidates(self, prompt: str) -> list[str] | None:
        if self._hot is not None:
            return self._matcher.candidates(prompt)
        ok, found = self._call("read", self._matcher.candidates, prompt)
        return found if ok else None  # type: ignore[return-value]

    def texts_of(self, keys: Sequence[str]) -> dict[str, str]:
        if self._hot is not None:
            return self._hot.texts(keys)
        if self.backend is None:
            return {}
        ok, found = self._call("read", self.backend.catalog_texts, self.fingerprint, list(keys))
        return dict(found) if ok and found else {}  # type: ignore[call-overload]

    def stored(self) -> None:
        """This process stored chunks: short lengths are re-read on the next match."""
        self._matcher.stale()

    # -- a memory-only store's rows: its hot tier's -------------------------------------------
    def hot_put(self, key: str, text: str, evicted: Sequence[str]) -> None:
        if self._hot is not None:
            self._hot.put(key, text, evicted)

    def hot_cleared(self) -> None:
        if self._hot is not None:
            self._hot.clear()

    def drop(self, keys: list[str]) -> bool:
        """Delete entries and their rows (texts leave matching with them); whether the backend did."""
        if self._hot is not None:
            self._hot.remove(keys)
        ok = self.backend is None or self._call("write", self.backend.drop, self.fingerprint, keys)[0]
        self.view.forget(keys)
        return ok

    def _read(self) -> dict[str, str] | None:
        if self.backend is None:
            return None
        ok, rows = self._call("read", self.backend.catalog, self.fingerprint)
        return dict(rows) if ok and rows is not None else None  # type: ignore[call-overload]

    def rows(self, *, refresh: bool = False) -> dict[str, str]:
        return self.view.rows(refresh=refresh)

    def add(self, texts: Mapping[str, str]) -> None:
        """Catalogue entries just stored (a backend that catalogues its own writes is not asked)."""
        if texts and self.backend is not None and not self.backend.self_cataloguing:
            self._call("write", self.backend.catalog_add, self.fingerprint, texts)
        self.view.add(texts)

    def repair(self, stored: Mapping[str, str]) -> None:
        """Catalogue again the entries of ``stored`` (key -> text, all in the backend) that lost their row."""
        if self.backend is None:
            return
        keys = list(stored)
        ok, rows = self._call("read", self.backend.catalog_has, self.fingerprint, keys)
        if not ok or rows is None:
            return
        lost = {k: stored[k] for k, hit in zip(keys, rows) if not hit}
        if lost and self._call("write", self.backend.catalog_add, self.fingerprint, lost)[0]:
            log.warning("KV store: %d stored chunks were missing from the catalog; catalogued them again", len(lost))
            self._count(repaired=len(lost))
            self.view.add(lost)
