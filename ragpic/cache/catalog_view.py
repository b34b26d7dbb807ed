"""CatalogView: a ChunkStore's cached copy of its backend's catalog (``key -> chunk text``).

The engine searches these texts in every prompt given without hints, so reading the
backend's catalog on each query would cost a round trip (or a folder scan): the copy is
re-read after ``refresh_s`` or on demand, and kept up to date with this process's writes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping


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
