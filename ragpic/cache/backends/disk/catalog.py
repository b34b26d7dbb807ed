"""FolderCatalog: a folder store's catalog calls, over the ``entries`` and ``anchors`` tables
of its ``index.sqlite`` (see :mod:`.index_db`).

A row is written in the transaction that catalogues its entry file and deleted, by a
trigger, with the entry's row: an evicted or dropped entry's text stops matching at once.
An old index opened read-only has no anchors: lookups then derive them from the catalog.
"""

from __future__ import annotations

import functools
import sqlite3
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ragpic.cache.backends.disk import folder
from ragpic.cache.format.anchors import ANCHOR, Posting


def heals(method):
    """Run ``method``; if SQLite finds the index damaged meanwhile ("malformed", "not a
    database"), move it aside, rebuild it from the entry files and run ``method`` again."""

    @functools.wraps(method)
    def run(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.DatabaseError as exc:
            if type(exc) is not sqlite3.DatabaseError:  # locked / full / read-only: not damage
                raise
            self._damaged(exc)
        return method(self, *args, **kwargs)

    return run


class FolderCatalog:
    """The catalog half of :class:`~ragpic.cache.backends.disk.DiskBackend` (a mixin: it uses
    the backend's ``_db``, ``path``, ``writable``, ``contains`` and ``_check_writable``)."""

    self_cataloguing = True  # put_many commits each entry's rows with its file

    @heals
    def catalog(self, fingerprint: str) -> dict[str, str]:
        """``key -> text`` of this fingerprint's catalogued entries whose file still exists."""
        rows = self._db.query("SELECT key, text FROM entries WHERE fingerprint = ?", (fingerprint,))
        present = {k: t for k, t in rows if self.contains(k)}
        stale = [k for k, _ in rows if k not in present]
        if stale and self.writable:
            self.catalog_remove(fingerprint, stale)
        return present

    @heals
    def catalog_add(self, fingerprint: str, items: Mapping[str, str]) -> None:
        """Catalogue stored entries that have no row yet (a repair: put_many catalogues its own)."""
        rows = [(k, fingerprint, t, size, time.time()) for k, t in items.items()
                if folder.is_key(k) and (size := folder.entry_size(self.path, k)) is not None]
        if rows:
            self._check_writable()
            with self._db.transaction() as con:
                self._db.insert_new(con, rows)

    def _in(self, sql: str, fingerprint: str, keys: Sequence[str]) -> list[tuple]:
        out: list[tuple] = []
        for lo in range(0, len(keys), 500):  # under SQLite's bound-parameter limit
            batch = list(keys[lo:lo + 500])
            out += self._db.query(sql.format(",".join("?" * len(batch))), [fingerprint, *batch])
        return out

    @heals
    def catalog_has(self, fingerprint: str, keys: Sequence[str]) -> list[bool]:
        """Whether each key has a row, by primary-key lookups in batches (no text is read)."""
        known = {k for (k,) in self._in("SELECT key FROM entries WHERE fingerprint = ? AND key IN ({})",
                                        fingerprint, keys)}
        return [k in known for k in keys]

    @heals
    def catalog_texts(self, fingerprint: str, keys: Sequence[str]) -> dict[str, str]:
        return dict(self._in("SELECT key, text FROM entries WHERE fingerprint = ? AND key IN ({})",
                             fingerprint, keys))

    @heals
    def catalog_remove(self, fingerprint: str, keys: Sequence[str]) -> None:
        if keys:
            self._check_writable()
            with self._db.transaction() as con:
                con.executemany("DELETE FROM entries WHERE fingerprint = ? AND key = ?",
                                [(fingerprint, k) for k in keys])

    @heals
    def anchor_lookup(self, fingerprint: str, anchors: Sequence[str]) -> dict[str, list[Posting]]:
        if not self._db.has_anchors:
            return super().anchor_lookup(fingerprint, anchors)  # type: ignore[misc]
        out: dict[str, list[Posting]] = {}
        for a, k, n, d in self._in("SELECT anchor, key, length, digest FROM anchors WHERE fingerprint = ?"
                                   " AND anchor IN ({})", fingerprint, anchors):
            out.setdefault(a, []).append(Posting(k, n, d))
        return out

    @heals
    def short_lengths(self, fingerprint: str) -> set[int]:
        if not self._db.has_anchors:
            return super().short_lengths(fingerprint)  # type: ignore[misc]
        return {n for (n,) in self._db.query("SELECT DISTINCT length FROM anchors WHERE fingerprint = ?"
                                             " AND length < ?", (fingerprint, ANCHOR))}
