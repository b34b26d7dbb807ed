"""HotTexts: the catalog of a memory-only store, which is its hot tier.

A :class:`~ragpic.cache.store.ChunkStore` without a backend holds chunks only in its hot tier,
so its texts must leave prompt matching exactly when their entries leave that tier (evicted,
dropped or cleared). The rows and their anchors are changed under one lock, with the tier.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ragpic.cache.backends.text_rows import TextRows
from ragpic.cache.store.text_match import TextMatcher


class HotTexts:
    """``key -> text`` (with anchors) of the entries a hot tier holds."""

    def __init__(self) -> None:
        self._rows = TextRows()
        self._lock = threading.Lock()

    def put(self, key: str, text: str, evicted: Sequence[str]) -> None:
        """``key`` was put in the tier, which evicted ``evicted`` (``key`` itself when too big)."""
        with self._lock:
            self._rows.remove(evicted)
            if key not in evicted:
                self._rows.add({key: text})

    def remove(self, keys: Sequence[str]) -> None:
        with self._lock:
            self._rows.remove(keys)

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()

    def texts(self, keys: Sequence[str]) -> dict[str, str]:
        with self._lock:
            return self._rows.texts(keys)

    def matcher(self) -> TextMatcher:
        def lookup(anchors: Sequence[str]):
            with self._lock:
                return self._rows.lookup(anchors)

        def shorts() -> set[int]:
            with self._lock:
                return self._rows.short_lengths()

        return TextMatcher(lookup, shorts)
