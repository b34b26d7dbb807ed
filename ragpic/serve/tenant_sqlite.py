"""FolderRecords: a server's tenant records in ``tenants.sqlite`` inside a folder store, so a
replica restarted on the same folder keeps its tenants' ids, and replicas sharing the folder
agree (docs/SERVING.md, *Tenants*). One SQLite transaction a call (``BEGIN IMMEDIATE``:
SQLite serialises writers across processes), so racing replicas cannot both make an id new or
both remove it. The file is the server's: the store's own ``index.sqlite`` and
``ragpic store check`` never read it.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from ragpic.cache.backends.disk.sqlite_file import check_header
from ragpic.errors import StoreError

__all__ = ["FILE_NAME", "FolderRecords", "open_folder_records"]

log = logging.getLogger("ragpic.serve")
FILE_NAME = "tenants.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ids (namespace TEXT NOT NULL, id TEXT NOT NULL, key TEXT NOT NULL,
                                PRIMARY KEY (namespace, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS refs (key TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS own (namespace TEXT NOT NULL, key TEXT NOT NULL,
                                PRIMARY KEY (namespace, key)) WITHOUT ROWID;
"""


class FolderRecords:
    """:class:`~ragpic.serve.tenant_records.TenantRecords` in the SQLite file ``path``.

    Raises:
        IndexDamaged: ``path`` is not an SQLite file (or is truncated).
        sqlite3.Error, OSError: it cannot be opened or written.
    """

    def __init__(self, path: str | Path, busy_s: float = 5.0) -> None:
        self.path = Path(path)
        self.where = str(self.path)
        if self.path.exists():
            check_header(self.path)  # SQLite never parses a file that is not one
        self._con = sqlite3.connect(self.path, timeout=busy_s, isolation_level=None, check_same_thread=False)
        self._lock = threading.Lock()  # one connection, every thread
        self._con.execute("PRAGMA journal_mode=WAL")
        self._con.executescript(_SCHEMA)

    def _tx(self, what: str, fn):
        """``fn(connection)`` in one write transaction; a failure raises StoreError (a 503)."""
        with self._lock:
            try:
                self._con.execute("BEGIN IMMEDIATE")
                try:
                    out = fn(self._con)
                except BaseException:
                    self._con.execute("ROLLBACK")
                    raise
                self._con.execute("COMMIT")
                return out
            except sqlite3.Error as exc:
                raise StoreError(f"tenant records ({what}) in {self.where}: {exc}") from exc

    def add(self, namespace: str, pairs: Sequence[tuple[str, str]]) -> list[bool]:
        def run(con: sqlite3.Connection) -> list[bool]:
            out = []
            for cid, key in pairs:
                new = con.execute("INSERT OR IGNORE INTO ids VALUES (?, ?, ?)", (namespace, cid, key)).rowcount == 1
                if new:
                    con.execute("INSERT INTO refs VALUES (?, 1) ON CONFLICT (key) DO UPDATE SET n = n + 1", (key,))
                con.execute("INSERT OR IGNORE INTO own VALUES (?, ?)", (namespace, key))
                out.append(new)
            return out

        return self._tx("add", run) if pairs else []

    def lookup(self, namespace: str, ids: Sequence[str]) -> dict[str, str]:
        def run(con: sqlite3.Connection) -> dict[str, str]:
            found = {}
            for cid in dict.fromkeys(ids):
                row = con.execute("SELECT key FROM ids WHERE namespace = ? AND id = ?", (namespace, cid)).fetchone()
                if row is not None:
                    found[cid] = row[0]
            return found

        return self._read("lookup", run)

    def remove(self, namespace: str, cid: str, key: str) -> int | None:
        def run(con: sqlite3.Connection) -> int | None:
            if con.execute("DELETE FROM ids WHERE namespace = ? AND id = ? AND key = ?",
                           (namespace, cid, key)).rowcount != 1:
                return None
            con.execute("DELETE FROM own WHERE namespace = ? AND key = ?", (namespace, key))
            row = con.execute("UPDATE refs SET n = n - 1 WHERE key = ? RETURNING n", (key,)).fetchone()
            left = row[0] if row is not None else 0
            if left <= 0:
                con.execute("DELETE FROM refs WHERE key = ?", (key,))
            return max(left, 0)

        return self._tx("remove", run)

    def owns(self, namespace: str, keys: Sequence[str]) -> list[bool]:
        def run(con: sqlite3.Connection) -> list[bool]:
            return [con.execute("SELECT 1 FROM own WHERE namespace = ? AND key = ?", (namespace, k)).fetchone()
                    is not None for k in keys]

        return self._read("owns", run)

    def note(self, namespace: str, keys: Sequence[str]) -> None:
        if keys:
            self._tx("note", lambda con: con.executemany("INSERT OR IGNORE INTO own VALUES (?, ?)",
                                                         [(namespace, k) for k in keys]))

    def refs(self, key: str) -> int:
        row = self._read("refs", lambda con: con.execute("SELECT n FROM refs WHERE key = ?", (key,)).fetchone())
        return row[0] if row is not None else 0

    def _read(self, what: str, fn):
        with self._lock:
            try:
                return fn(self._con)
            except sqlite3.Error as exc:
                raise StoreError(f"tenant records ({what}) in {self.where}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._con.close()


def open_folder_records(folder: Path) -> FolderRecords | None:
    """:class:`FolderRecords` in ``folder``, or None with a warning saying why (a read-only
    folder, a damaged file): the caller keeps the records in its process."""
    try:
        return FolderRecords(Path(folder) / FILE_NAME)
    except (OSError, sqlite3.Error, StoreError) as exc:
        log.warning("tenant records: cannot keep them in %s (%s): ids stay in this process (lost at exit, "
                    "unknown to other replicas)", Path(folder) / FILE_NAME, exc)
        return None
