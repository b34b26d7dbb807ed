"""DiskBackend: entries in a diskcache folder beside the vector index.

Folder layout::

    <path>/manifest.json    format version, fingerprint and recipes; written once, never rewritten
    <path>/kv/              diskcache.Cache (sqlite index + one file per entry >= 32 KiB)
    <path>/catalog.sqlite   side index (fingerprint, key) -> chunk text, see ChunkStore.texts()

Atomicity: diskcache writes a large value to a fresh, uniquely named file and only then
inserts the sqlite row that points to it, in one transaction. A writer killed mid-file
leaves an orphan file but no row, so the key reads as absent; a failed write (disk full)
removes its half-written file here. Each row is either fully there or absent. Several
processes may open the same folder: sqlite serialises writers. After a power loss an
un-fsynced file may be short or zeroed; the checksum in :mod:`ragpic.cache.entry` is the
last line of defence.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import diskcache

from ragpic.cache.entry import FORMAT_VERSION

log = logging.getLogger("ragpic.cache")

DEFAULT_SIZE_LIMIT = 8 * 2**30


class _SafeDisk(diskcache.Disk):
    """diskcache.Disk that remembers, per thread, the value file the current ``set`` creates."""

    def __init__(self, directory: str, **kwargs: Any) -> None:
        super().__init__(directory, **kwargs)
        self.pending = threading.local()

    def filename(self, key: Any = diskcache.core.UNKNOWN, value: Any = diskcache.core.UNKNOWN) -> tuple[str, str]:
        name, full = super().filename(key, value)
        self.pending.path = full
        return name, full


class DiskBackend:
    """Process-safe, size-limited store of entry bytes in a folder (LRU eviction).

    Args:
        path: folder (created if missing).
        size_limit_bytes: diskcache ``size_limit``; entries are culled least recently used
            first once the folder's volume passes it (8 GiB default; diskcache's own
            default of 1 GiB holds only ~91 SmolLM2 512-token fp16 chunks).
        fingerprint, recipes: recorded in ``manifest.json`` when the folder is created.
    """

    def __init__(self, path: str | os.PathLike[str], size_limit_bytes: int = DEFAULT_SIZE_LIMIT, *,
                 fingerprint: str | None = None, recipes: Sequence[str] = ()) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._write_manifest_once(fingerprint, list(recipes))
        manifest = self.manifest()
        if int(manifest.get("format_version", 0)) > FORMAT_VERSION:
            raise ValueError(f"KV store {self.path} has format version {manifest['format_version']}; "
                             f"this ragpic reads up to {FORMAT_VERSION}: upgrade ragpic or use another folder")
        if fingerprint is not None and manifest.get("fingerprint") != fingerprint:
            log.info("KV store %s was created for fingerprint %r; entries for %r are kept beside "
                     "them (keys are content-addressed)", self.path, manifest.get("fingerprint"), fingerprint)
        self.size_limit_bytes = int(size_limit_bytes)
        self._cache = diskcache.Cache(str(self.path / "kv"), disk=_SafeDisk, size_limit=self.size_limit_bytes,
                                      eviction_policy="least-recently-used")
        self._warned_readonly = False
        self._db_lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path / "catalog.sqlite"), timeout=60, check_same_thread=False,
                                   isolation_level=None)
        with self._db_lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS catalog (fingerprint TEXT NOT NULL, key TEXT NOT NULL,"
                             " text TEXT NOT NULL, PRIMARY KEY (fingerprint, key)) WITHOUT ROWID")
            self._db.execute("CREATE INDEX IF NOT EXISTS catalog_key ON catalog(key)")

    # -- manifest --------------------------------------------------------------------------
    def _write_manifest_once(self, fingerprint: str | None, recipes: list[str]) -> None:
        target = self.path / "manifest.json"
        if target.exists():
            return
        body = {"format": "ragpic-kv-store", "format_version": FORMAT_VERSION, "fingerprint": fingerprint,
                "recipes": recipes, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        tmp = self.path / f".manifest.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
        try:
            os.link(tmp, target)  # atomic and exclusive: the first writer wins, nobody rewrites
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)

    def manifest(self) -> dict[str, Any]:
        """The folder's manifest: ``format_version``, ``fingerprint``, ``recipes``, ``created``."""
        return json.loads((self.path / "manifest.json").read_text(encoding="utf-8"))

    # -- KVBackend ---------------------------------------------------------------------------
    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for key in keys:
            try:
                value = self._cache.get(key, default=None)
            except sqlite3.OperationalError as exc:
                # an LRU read also writes (access time): on a full or read-only disk that
                # write fails, but the entry is still there to read
                if not self._warned_readonly:
                    self._warned_readonly = True
                    log.warning("KV store %s cannot record reads (%s); reading without LRU updates", self.path, exc)
                value = self._peek(key)
            out.append(value if isinstance(value, bytes) else None)
        return out

    def _peek(self, key: str) -> bytes | None:
        """Read an entry without writing anything (diskcache's table layout, v5)."""
        row = self._cache._sql(  # noqa: SLF001 - read-only query on diskcache's own table
            "SELECT mode, filename, value FROM Cache WHERE key = ? AND raw = 1"
            " AND (expire_time IS NULL OR expire_time > ?)", (key, time.time())).fetchone()
        if row is None:
            return None
        mode, filename, value = row
        if mode == diskcache.core.MODE_RAW and isinstance(value, bytes):
            return value
        if mode == diskcache.core.MODE_BINARY and filename:
            try:
                return (self.path / "kv" / filename).read_bytes()
            except OSError:
                return None
        return None

    def put_many(self, items: Mapping[str, bytes]) -> None:
        disk: _SafeDisk = self._cache.disk  # type: ignore[assignment]
        for key, value in items.items():
            disk.pending.path = None
            try:
                self._cache.set(key, bytes(value))
            except BaseException:
                # the row was not committed: no reader can reach the file; don't leak it
                if disk.pending.path:
                    with contextlib.suppress(OSError):
                        os.remove(disk.pending.path)
                raise

    def contains(self, key: str) -> bool:
        return key in self._cache

    def delete(self, key: str) -> None:
        self._cache.delete(key)
        with self._db_lock:
            self._db.execute("DELETE FROM catalog WHERE key = ?", (key,))

    def stats(self) -> dict[str, Any]:
        return {"backend": "disk", "path": str(self.path), "entries": len(self._cache),
                "volume_bytes": self._cache.volume(), "size_limit_bytes": self.size_limit_bytes}

    def close(self) -> None:
        self._cache.close()
        with self._db_lock:
            self._db.close()

    # -- catalog -----------------------------------------------------------------------------
    def catalog(self, fingerprint: str) -> dict[str, str]:
        """``key -> text`` for this fingerprint's entries still in the cache (evicted rows pruned)."""
        with self._db_lock:  # rows before keys: a row is only added after its entry is stored
            rows = self._db.execute("SELECT key, text FROM catalog WHERE fingerprint = ?", (fingerprint,)).fetchall()
        present = set(self._cache.iterkeys())
        stale = [k for k, _ in rows if k not in present]
        if stale:
            self.catalog_remove(fingerprint, stale)
        return {k: t for k, t in rows if k in present}

    def catalog_add(self, fingerprint: str, items: Mapping[str, str]) -> None:
        self._write_catalog("INSERT OR REPLACE INTO catalog (fingerprint, key, text) VALUES (?, ?, ?)",
                            [(fingerprint, k, t) for k, t in items.items()])

    def catalog_remove(self, fingerprint: str, keys: Sequence[str]) -> None:
        self._write_catalog("DELETE FROM catalog WHERE fingerprint = ? AND key = ?", [(fingerprint, k) for k in keys])

    def _write_catalog(self, sql: str, rows: list[tuple[str, ...]]) -> None:
        """Run ``sql`` over ``rows`` in one transaction (all rows or none)."""
        if not rows:
            return
        with self._db_lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(sql, rows)
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise
