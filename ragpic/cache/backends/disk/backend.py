"""DiskBackend: entries as files in a folder beside the vector index, with a SQLite index.

Folder layout::

    <path>/manifest.json     format versions, fingerprint, recipes; written once (see manifest.py)
    <path>/entries/          one file per entry, named by its key (see folder.py)
    <path>/index.sqlite      catalog (texts and their anchors) + LRU clock + write journal (see index_db.py)
    <path>/damaged/          databases (and unreadable legacy folders) moved aside, for a look
    <path>/legacy/           a ragpic 0.1 folder, or a text index an older ragpic kept beside
                             the folder (``<path>.text-index.sqlite``), moved in on open

Nothing is written outside ``<path>``: a store is one folder (docs/ARCHITECTURE.md §2).

The store reads and writes only its own formats: entry bytes are never unpickled (there is
no pickle anywhere), file names come from keys, never from a database row, and each path
is checked to lie inside the folder. diskcache is not used: its reads unpickle whatever a
row's mode says, so a crafted ``cache.db`` in a shared folder would run code in every
process that opens it; a ragpic 0.1 diskcache folder is imported safely on open (see legacy.py).

Writes: each batch first journals its keys in ``pending``, then per entry writes a
temporary file and renames it into place, and commits the rows (the catalog) of each group
of up to 64 written entries in one transaction. A failure (disk full) commits the rows of
the files written before it, and removes the files whose rows could not be committed, so a
failed batch leaves only entries that are both stored and catalogued. A writer killed in
between leaves ``pending`` rows; the next open settles them (see reconcile.py).

Opening heals: a database that is damaged (not SQLite, truncated, not ragpic's schema,
"malformed") is moved to ``damaged/`` and rebuilt from the intact entry files, with a
warning; a deleted one is rebuilt too. A read-only folder serves reads (its index opened
read-only, or rebuilt in memory); a full disk serves reads and every write says why it
failed. Reads come from the files, so even a lost index never hides an entry from a lookup.
Several processes may share a folder: SQLite serialises writers, renames are atomic. After
a power loss an un-fsynced file may be short or zeroed; the entry checksum catches it.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ragpic.cache.backends.base import KVBackend
from ragpic.cache.backends.disk import folder, index_open, manifest
from ragpic.cache.backends.disk.catalog import FolderCatalog, heals
from ragpic.cache.format.entry_header import read_header

log = logging.getLogger("ragpic.cache")

DEFAULT_SIZE_LIMIT = 8 * 2**30
# Rows of written files are committed per group: one transaction per entry cost 0.3 ms, as
# much as creating the file, for small entries; a crash mid-group is settled on open.
_GROUP, _GROUP_BYTES = 64, 64 * 2**20


class DiskBackend(FolderCatalog, KVBackend):
    """Process-safe, size-limited store of entry bytes in a folder (LRU eviction).

    Args:
        path: folder (created if missing; ``~`` expanded).
        size_limit_bytes: entries are evicted least recently used first once their bytes
            pass this (8 GiB default: ~1,400 SmolLM2 512-token chunks in int8, ~360 in fp32).
        fingerprint, recipes: recorded in ``manifest.json`` when the folder is created.
        busy_s: how long a query-path statement waits for another process's write lock.
        orphan_age_s: a temporary file or journal row of another host's writer older than
            this is an orphan (this host's writers are orphans as soon as they are gone).

    Raises:
        OSError: the folder cannot be created (open_store then falls back to memory).
        ConfigError: the folder holds a newer format than this ragpic reads.
    """

    def __init__(self, path: str | os.PathLike[str], size_limit_bytes: int = DEFAULT_SIZE_LIMIT, *,
                 fingerprint: str | None = None, recipes: Sequence[str] = (), busy_s: float = 0.25,
                 orphan_age_s: float = 3600.0) -> None:
        self.path = Path(os.path.expanduser(os.fspath(path)))
        if not self.path.is_dir():
            self.path.mkdir(parents=True, exist_ok=True)
        self.size_limit_bytes = int(size_limit_bytes)
        self.orphan_age_s = orphan_age_s
        self.evictions = 0
        self.why_readonly = None if os.access(self.path, os.W_OK) else "it is read-only (mount or permissions)"
        if self.why_readonly is None:
            try:
                manifest.write_once(self.path, fingerprint, list(recipes))
            except OSError as exc:
                self.why_readonly = index_open.why_unwritable(self.path, exc)
        manifest.check(self.path, str(path), fingerprint)
        self._warned_touch = False
        self._busy_s = busy_s
        self._db, self.why_readonly = index_open.open_index(self.path, why_readonly=self.why_readonly,
                                                            busy_s=busy_s, orphan_age_s=orphan_age_s)
        if self.writable:
            index_open.heal_on_open(self.path, self._db, lambda k, d: self.put_many({k: d}, patient=True),
                                    orphan_age_s=orphan_age_s)

    def _damaged(self, exc: Exception) -> None:
        self._db, self.why_readonly = index_open.replace_damaged(
            self.path, self._db, exc, why_readonly=self.why_readonly, busy_s=self._busy_s,
            orphan_age_s=self.orphan_age_s)

    @property
    def writable(self) -> bool:
        return self.why_readonly is None

    # -- KVBackend: reads -------------------------------------------------------------------
    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        out = [folder.read_entry(self.path, k) if folder.is_key(k) else None for k in keys]
        self._touch([k for k, d in zip(keys, out) if d is not None])
        return out

    def _touch(self, keys: list[str]) -> None:
        """Record reads for LRU; a read-only or full disk just cannot (reads still work)."""
        if not keys or not self.writable:
            return
        try:
            with self._db.transaction() as con:
                con.executemany("UPDATE entries SET access = ? WHERE key = ?", [(time.time(), k) for k in keys])
        except sqlite3.DatabaseError as exc:
            if type(exc) is sqlite3.DatabaseError:
                self._damaged(exc)
            elif not self._warned_touch:
                self._warned_touch = True
                log.warning("KV store %s cannot record reads (%s); reading without LRU updates", self.path, exc)

    def contains(self, key: str) -> bool:
        return folder.is_key(key) and folder.entry_size(self.path, key) is not None

    @heals
    def keys(self) -> list[str]:
        """Every catalogued key (any fingerprint)."""
        return [k for (k,) in self._db.query("SELECT key FROM entries")]

    # -- KVBackend: writes ------------------------------------------------------------------
    def _check_writable(self) -> None:
        if not self.writable:
            code = errno.ENOSPC if "disk is full" in str(self.why_readonly) else errno.EROFS
            raise OSError(code, f"KV store folder {self.path} takes no writes: {self.why_readonly}")

    @heals
    def put_many(self, items: Mapping[str, bytes], *, patient: bool = False) -> None:
        """Store each entry with its catalog row (see the module docstring).

        Raises:
            ValueError: a key that is not a chunk key, or bytes that are not an entry.
            OSError / sqlite3.Error: the write failed; entries before it stay stored.
        """
        self._check_writable()
        heads = {}
        for key, data in items.items():
            if not folder.is_key(key):
                raise ValueError(f"DiskBackend keys are chunk keys (64 lowercase hex), got {key!r}")
            heads[key] = read_header(data)[0]
        writer, now = folder.writer_id(), time.time()
        with self._db.transaction(patient=patient) as con:
            con.executemany("INSERT OR IGNORE INTO pending VALUES (?, ?, ?)", [(k, writer, now) for k in items])
        written: list[tuple[str, int]] = []  # files on disk whose rows are not committed yet
        try:
            for key, data in items.items():
                written.append((key, folder.write_entry(self.path, key, bytes(data), writer)))
                if len(written) >= _GROUP or sum(n for _, n in written) >= _GROUP_BYTES:
                    self._commit_rows(written, heads, writer, patient)  # empties ``written``
            self._commit_rows(written, heads, writer, patient)
        except BaseException:
            if written:  # a file write failed: catalogue the ones before it, or remove them
                try:
                    self._commit_rows(written, heads, writer, patient)
                except BaseException:
                    pass
            raise
        finally:
            try:
                with self._db.transaction(patient=patient) as con:
                    con.execute("DELETE FROM pending WHERE writer = ?", (writer,))
            except sqlite3.Error:
                pass  # settled by the next open once this process is gone
        self._evict()

    def _commit_rows(self, written: list[tuple[str, int]], heads: dict[str, dict], writer: str,
                     patient: bool) -> None:
        """Catalogue written files in one transaction. Files whose rows cannot be committed
        are removed (never a stored-but-uncatalogued entry) and the error raised; on a full
        disk the newest file is removed first and the rest retried, so a batch that fills
        the disk keeps every entry that fits."""
        while written:
            try:
                with self._db.transaction(patient=patient) as con:
                    now = time.time()
                    self._db.upsert(con, [(k, heads[k]["fingerprint"], heads[k]["text"], n, now) for k, n in written])
                    con.executemany("DELETE FROM pending WHERE key = ? AND writer = ?",
                                    [(k, writer) for k, _ in written])
                written.clear()
            except BaseException as exc:
                if len(written) > 1 and self._disk_full(exc):
                    folder.remove_entry(self.path, written.pop()[0])
                    continue
                for key, _ in written:
                    folder.remove_entry(self.path, key)
                written.clear()
                raise

    def _disk_full(self, exc: BaseException) -> bool:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return True
        if not isinstance(exc, sqlite3.OperationalError):
            return False
        # SQLite says "database or disk is full", or only "disk I/O error": ask the filesystem
        return "is full" in str(exc) or "disk is full" in index_open.why_unwritable(self.path, exc)

    def _evict(self) -> None:
        """Remove least recently used entries until their bytes fit the size limit."""
        while True:
            _, total = self._db.totals()
            if total <= self.size_limit_bytes:
                return
            victims, freed = [], 0
            for key, nbytes in self._db.query("SELECT key, bytes FROM entries ORDER BY access, key LIMIT 64"):
                victims.append(key)
                freed += nbytes
                if total - freed <= self.size_limit_bytes:
                    break
            if not victims:
                return
            for key in victims:  # file first: a reader then sees a miss, never a row without data
                folder.remove_entry(self.path, key)
            with self._db.transaction() as con:
                con.executemany("DELETE FROM entries WHERE key = ?", [(k,) for k in victims])
                if self._db.has_counters:
                    self._db.add_counters(con, {"evictions": len(victims)})
            self.evictions += len(victims)

    @heals
    def delete(self, key: str) -> None:
        self._check_writable()
        if folder.is_key(key):
            folder.remove_entry(self.path, key)
        with self._db.transaction() as con:
            con.execute("DELETE FROM entries WHERE key = ?", (key,))

    @heals
    def stats(self) -> dict[str, Any]:
        entries, volume = self._db.totals()
        return {"backend": "disk", "path": str(self.path), "entries": entries, "volume_bytes": volume,
                "size_limit_bytes": self.size_limit_bytes, "evictions": self.evictions,
                "writable": self.writable, "why_readonly": self.why_readonly}

    @heals
    def add_counters(self, deltas: Mapping[str, int]) -> None:
        """Add a process's counts (hits, misses, ...) to the folder's persistent counters."""
        self._check_writable()
        if self._db.has_counters and any(deltas.values()):
            with self._db.transaction() as con:
                self._db.add_counters(con, dict(deltas))

    @heals
    def counters(self) -> dict[str, int]:
        """What every process using this folder counted (``{}`` on a read-only old index)."""
        return self._db.counters()

    def manifest(self) -> dict[str, Any]:
        """The folder's manifest (``{}`` when absent or unreadable, see manifest.py)."""
        return manifest.read(self.path)[0]

    def close(self) -> None:
        self._db.close()
