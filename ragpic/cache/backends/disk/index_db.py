"""``index.sqlite``: a folder store's catalog, LRU clock and write journal, checked on open.

The database is a cache of what the entry files say (each entry's header holds its
fingerprint and text), so it can always be rebuilt from them; it holds no file names.
Its tables, and the older versions of them it upgrades, are in :mod:`.index_schema`.

A database that is not exactly this schema, is truncated, or fails to open is reported as
:class:`IndexDamaged`: the caller moves it aside and rebuilds. Opened with SQLite's
defences for untrusted files (``trusted_schema=OFF``, ``cell_size_check=ON``, no mmap);
Python's ``sqlite3`` never unpickles and cannot load extensions unless asked.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from ragpic.cache.backends.disk.index_schema import ANCHORS, COUNTERS, MASTER, MASTER_V1, MASTER_V2, SCHEMA
from ragpic.cache.backends.disk.sqlite_file import check_header, connect_readonly
from ragpic.cache.format.anchors import posting_of
from ragpic.errors import IndexDamaged  # raised here; defined with ragpic's other errors

__all__ = ["IndexDB", "IndexDamaged", "SCHEMA", "check_header"]

Row = tuple[str, str, str, int, float]  # key, fingerprint, text, bytes, access


class IndexDB:
    """One connection to ``index.sqlite`` (or an in-memory stand-in), shared under a lock.

    Args:
        path: the database file, or ``None`` for an in-memory index (read-only folders
            whose database cannot be opened).
        readonly: open without writing (``immutable=1`` when even a read lock is impossible).
        busy_s: how long a statement waits for another process's write lock.

    Raises:
        IndexDamaged: see the module docstring.
    """

    def __init__(self, path: Path | None, *, readonly: bool = False, busy_s: float = 0.25) -> None:
        self.path, self.readonly = path, readonly
        self._lock = threading.Lock()
        self._busy_ms = max(1, int(busy_s * 1000))
        self._con: sqlite3.Connection | None = None
        self.has_counters = self.has_anchors = False
        try:
            self._con = self._connect()
            self._check_or_create()
            self.inode = path.stat().st_ino if path is not None else None
        except sqlite3.DatabaseError as exc:
            if self._con is not None:
                self._con.close()
            if type(exc) is sqlite3.DatabaseError:  # "malformed", "not a database"; not locked / full
                raise IndexDamaged(f"{type(exc).__name__}: {exc}") from None
            raise
        except IndexDamaged:
            if self._con is not None:
                self._con.close()
            raise

    def _connect(self) -> sqlite3.Connection:
        if self.path is None:
            con = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        else:
            if self.path.exists():
                check_header(self.path)
            if self.readonly:
                con = connect_readonly(self.path)
            else:
                con = sqlite3.connect(str(self.path), timeout=self._busy_ms / 1000, check_same_thread=False,
                                      isolation_level=None)
        for pragma in ("trusted_schema=OFF", "cell_size_check=ON", "mmap_size=0", f"busy_timeout={self._busy_ms}"):
            con.execute(f"PRAGMA {pragma}")
        if not self.readonly:
            con.execute("PRAGMA synchronous=NORMAL")  # per connection: WAL commits without an fsync each
        return con

    def _check_or_create(self) -> None:
        """Check the schema, or create it in an empty database. Several processes may open
        a new folder at once: the check is repeated under the write lock, and opening waits
        for a lock as long as ingest does (it is not on a query's path)."""
        if not self._master() and not self.readonly:
            self._con.execute("PRAGMA busy_timeout=60000")
            if self.path is not None:
                self._con.execute("PRAGMA journal_mode=WAL")
            with self.transaction(patient=True):
                if not self._master():
                    for stmt in SCHEMA:
                        self._con.execute(stmt)
        if self._master() in (MASTER_V1, MASTER_V2) and not self.readonly:
            with self.transaction(patient=True) as con:  # another process may have just added them
                if self._master() == MASTER_V1:
                    con.execute(COUNTERS)
                if self._master() == MASTER_V2:
                    for stmt in ANCHORS:
                        con.execute(stmt)
                    self._write_anchors(con, con.execute("SELECT key, fingerprint, text FROM entries").fetchall())
        master = self._master()
        if master != MASTER and not (self.readonly and master in (MASTER_V1, MASTER_V2)):
            raise IndexDamaged("its tables are not ragpic's index schema")
        self.has_counters = master in (MASTER, MASTER_V2)
        self.has_anchors = master == MASTER
        if self._con.execute("SELECT count(*) FROM totals").fetchone() != (1,):
            raise IndexDamaged("its totals row is missing")
        self._con.execute("SELECT key FROM entries LIMIT 1").fetchall()

    def _master(self) -> set[tuple]:
        return set(self._con.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"))

    @contextlib.contextmanager
    def transaction(self, *, patient: bool = False) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` .. ``COMMIT`` under the lock (rolled back on any exception).
        ``patient`` waits up to 60 s for another writer instead of the query budget."""
        with self._lock:
            if patient:
                self._con.execute("PRAGMA busy_timeout=60000")
            try:
                self._con.execute("BEGIN IMMEDIATE")
                try:
                    yield self._con
                    self._con.execute("COMMIT")
                except BaseException:
                    if self._con.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            self._con.execute("ROLLBACK")
                    raise
            finally:
                if patient:
                    self._con.execute(f"PRAGMA busy_timeout={self._busy_ms}")

    def query(self, sql: str, args: Sequence[object] = ()) -> list[tuple]:
        with self._lock:
            return self._con.execute(sql, tuple(args)).fetchall()

    # -- the few statements the store runs --------------------------------------------------
    def upsert(self, con: sqlite3.Connection, rows: Sequence[Row]) -> None:
        """Write each entry's row (replacing an older one) and its anchor row."""
        con.executemany("INSERT INTO entries (key, fingerprint, text, bytes, access) VALUES (?, ?, ?, ?, ?)"
                        " ON CONFLICT(key) DO UPDATE SET fingerprint = excluded.fingerprint,"
                        " text = excluded.text, bytes = excluded.bytes, access = excluded.access", rows)
        self._write_anchors(con, [(k, fp, t) for k, fp, t, _, _ in rows])

    def insert_new(self, con: sqlite3.Connection, rows: Sequence[Row]) -> None:
        """Write the rows of entries that have none yet (a repair), with their anchor rows."""
        known = {k for (k,) in _select_in(con, "SELECT key FROM entries WHERE key IN ({})", [r[0] for r in rows])}
        new = [r for r in rows if r[0] not in known]
        con.executemany("INSERT INTO entries (key, fingerprint, text, bytes, access) VALUES (?, ?, ?, ?, ?)"
                        " ON CONFLICT(key) DO NOTHING", new)
        self._write_anchors(con, [(k, fp, t) for k, fp, t, _, _ in new])

    def _write_anchors(self, con: sqlite3.Connection, rows: Sequence[tuple[str, str, str]]) -> None:
        if not rows or not self._has_anchor_table(con):
            return
        con.executemany("INSERT OR REPLACE INTO anchors VALUES (?, ?, ?, ?, ?)",
                        [(k, fp, *_anchor_row(k, t)) for k, fp, t in rows])

    def _has_anchor_table(self, con: sqlite3.Connection) -> bool:
        return self.has_anchors or con.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'anchors'").fetchone() is not None

    def add_counters(self, con: sqlite3.Connection, deltas: dict[str, int]) -> None:
        """Add to the store's persistent counters (inside the caller's transaction)."""
        con.executemany("INSERT INTO counters VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                        [(k, int(v)) for k, v in deltas.items() if v])

    def counters(self) -> dict[str, int]:
        if not self.has_counters:
            return {}
        return {k: int(v) for k, v in self.query("SELECT name, value FROM counters")}

    def totals(self) -> tuple[int, int]:
        ((n, b),) = self.query("SELECT entries, bytes FROM totals")
        return int(n), int(b)

    def close(self) -> None:
        with self._lock:
            self._con.close()


def _anchor_row(key: str, text: str) -> tuple[str, int, str]:
    anchor, post = posting_of(key, text)
    return anchor, post.length, post.digest


def _select_in(con: sqlite3.Connection, sql: str, values: Sequence[str], *head: object) -> list[tuple]:
    """``sql`` (one ``IN ({})``) over ``values`` in batches under SQLite's bound-parameter limit."""
    out: list[tuple] = []
    for lo in range(0, len(values), 500):
        part = list(values[lo:lo + 500])
        out += con.execute(sql.format(",".join("?" * len(part))), (*head, *part)).fetchall()
    return out
