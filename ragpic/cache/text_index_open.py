"""open_text_index: the chunk text index that goes with an opened store (see :mod:`.text_index`)."""

from __future__ import annotations

import logging
from pathlib import Path

from ragpic.cache.spec import parse_store
from ragpic.cache.text_index import TextIndex
from ragpic.cache.text_index_tables import MemoryTable, RedisTable, SqliteTable

__all__ = ["index_path", "open_text_index"]

log = logging.getLogger("ragpic.cache")


def index_path(folder: str | Path) -> Path:
    """The SQLite file of a folder store's index: *beside* the folder (``kv`` -> ``kv.text-index.sqlite``),
    so the folder's own checks never see a file they do not know."""
    folder = Path(folder)
    return folder.with_name(folder.name + ".text-index.sqlite")


def _table(spec, store):
    parsed = parse_store(spec)
    if parsed.kind == "redis" and store.backend is not None:
        # the store's own connections: the same short timeouts (the query budget) apply
        return RedisTable(store.backend.client, getattr(store.backend, "prefix", "ragpic:"), store.fingerprint)
    if parsed.kind == "folder" and store.backend is not None:
        return SqliteTable(index_path(parsed.target), store.fingerprint)
    return MemoryTable()


def open_text_index(spec, store) -> TextIndex:
    """The index for ``store`` (opened from ``spec``): Redis beside a Redis store, SQLite beside a
    folder, memory otherwise. A store indexed for the first time is filled from its catalog once
    (an O(store) pass, then never again); a table that cannot be opened falls back to memory."""
    try:
        table = _table(spec, store)
        index = TextIndex(table, spill=MemoryTable())
        if not table.filled or _behind(table, store):
            n = index.fill_from(store.texts().items())
            table.mark_filled()
            if n:
                log.info("chunk text index: indexed the %d chunks already stored", n)
        return index
    except Exception as exc:
        log.warning("chunk text index unavailable (%s: %s); indexing in memory", type(exc).__name__, exc)
        index = TextIndex(MemoryTable())
        try:
            index.fill_from(store.texts().items())
        except Exception as again:  # a store without a catalog: chunks are indexed as they are stored
            log.warning("chunk text index: the store's catalog is unreadable (%s)", again)
        return index


def _behind(table, store) -> bool:
    """Whether the index holds fewer chunks than the store: an add that failed (a full disk,
    an outage) left stored chunks unindexed, so they would never be found without hints.
    Both counts are cheap; the refill that follows is the one O(store) pass, and only then."""
    try:
        entries = (store.backend.stats() or {}).get("entries") if store.backend is not None else None
        return entries is not None and table.count() < int(entries)
    except Exception:  # a count the backend cannot give: trust the filled marker
        return False
