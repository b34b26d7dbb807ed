"""TextRows: one fingerprint's catalog held in process memory, texts and anchors together.

Used by :class:`~ragpic.cache.backends.memory.MemoryBackend` and by a memory-only
:class:`~ragpic.cache.store.ChunkStore` (whose catalog is its hot tier). Not locked: its
owner changes it under the same lock as the entries, so a row and its entry come and go
together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ragpic.cache.format.anchors import ANCHOR, Posting, posting_of


class TextRows:
    """``key -> text`` with ``anchor -> {key: Posting}`` kept beside it."""

    def __init__(self) -> None:
        self._texts: dict[str, str] = {}
        self._anchors: dict[str, dict[str, Posting]] = {}
        self._shorts: dict[int, int] = {}  # length of a short chunk -> how many

    def add(self, items: Mapping[str, str]) -> None:
        for key, text in items.items():
            self.remove([key])
            anchor, post = posting_of(key, text)
            self._texts[key] = text
            self._anchors.setdefault(anchor, {})[key] = post
            if len(text) < ANCHOR:
                self._shorts[len(text)] = self._shorts.get(len(text), 0) + 1

    def remove(self, keys: Iterable[str]) -> None:
        for key in keys:
            text = self._texts.pop(key, None)
            if text is None:
                continue
            anchor, _ = posting_of(key, text)
            posts = self._anchors.get(anchor, {})
            posts.pop(key, None)
            if not posts:
                self._anchors.pop(anchor, None)
            if len(text) < ANCHOR:
                self._shorts[len(text)] -= 1
                if not self._shorts[len(text)]:
                    del self._shorts[len(text)]

    def clear(self) -> None:
        self._texts.clear()
        self._anchors.clear()
        self._shorts.clear()

    def rows(self) -> dict[str, str]:
        return dict(self._texts)

    def __contains__(self, key: object) -> bool:
        return key in self._texts

    def texts(self, keys: Sequence[str]) -> dict[str, str]:
        return {k: self._texts[k] for k in keys if k in self._texts}

    def lookup(self, anchors: Sequence[str]) -> dict[str, list[Posting]]:
        return {a: list(self._anchors[a].values()) for a in anchors if a in self._anchors}

    def short_lengths(self) -> set[int]:
        return set(self._shorts)
