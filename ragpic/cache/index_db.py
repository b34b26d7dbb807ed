"""``index.sqlite``: a folder store's catalog, LRU clock and write journal, checked on open.

The database is a cache of what the entry files say (each entry's header holds its
fingerprint and text), so it can always be rebuilt from them; it holds no file names.
Tables (see ``SCHEMA``):

- ``entries(key, fingerprint, text, bytes, access)``: one row per catalogued entry; the
  catalog of a fingerprint is its rows, ``access`` orders LRU eviction.
- ``pending(key, writer, started)``: keys a writer is about to write; a row left by a dead
  writer marks an interrupted write to reconcile on open (see :mod:`ragpic.cache.disk`).
- ``totals``: entry count and bytes, kept by triggers, so stats and the size check are O(1).
- ``counters(name, value)``: what every process using the folder did (hits, misses,
  evictions, recompiles...), added to by each :class:`ChunkStore` (see ``ragpic store stats``).
  An index made before this table existed gets it when opened writable.

A database that is not exactly this schema, is truncated, or fails to open is reported as
:class:`IndexDamaged`: the caller moves it aside and rebuilds. Opened with SQLite's
defences for untrusted files (``trusted_schema=OFF``, ``cell_size_check=ON``, no mmap);
Python's ``sqlite3`` never unpickles and cannot load extensions unless asked.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import struct
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

SCHEMA = (
    "CREATE TABLE entries (key TEXT PRIMARY KEY NOT NULL, fingerprint TEXT NOT NULL, text TEXT NOT NULL,"
    " bytes INTEGER NOT NULL, access REAL NOT NULL) WITHOUT ROWID",
    "CREATE INDEX entries_fingerprint ON entries(fingerprint)",
    "CREATE INDEX entries_access ON entries(access)",
    "CREATE TABLE pending (key TEXT NOT NULL, writer TEXT NOT NULL, started REAL NOT NULL,"
    " PRIMARY KEY (key, writer)) WITHOUT ROWID",
    "CREATE TABLE totals (id INTEGER PRIMARY KEY CHECK (id = 0), entries INTEGER NOT NULL, bytes INTEGER NOT NULL)",
    "INSERT INTO totals VALUES (0, 0, 0)",
    "CREATE TRIGGER entries_ins AFTER INSERT ON entries BEGIN"
    " UPDATE totals SET entries = entries + 1, bytes = bytes + NEW.bytes; END",
    "CREATE TRIGGER entries_del AFTER DELETE ON entries BEGIN"
    " UPDATE totals SET entries = entries - 1, bytes = bytes - OLD.bytes; END",
    "CREATE TRIGGER entries_upd AFTER UPDATE OF bytes ON entries BEGIN"
    " UPDATE totals SET bytes = bytes - OLD.bytes + NEW.bytes; END",
)
# Added after the first release: a folder whose index has only SCHEMA_V1 gets it on open.
COUNTERS = "CREATE TABLE counters (name TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) WITHOUT ROWID"
SCHEMA_V1, SCHEMA = SCHEMA, SCHEMA + (COUNTERS,)
_SQLITE_MAGIC = b"SQLite format 3\x00"


class IndexDamaged(Exception):
    """``index.sqlite`` is not a ragpic index or is damaged; the message says how."""


def _reference_master(schema: tuple[str, ...]) -> set[tuple]:
    con = sqlite3.connect(":memory:")
    for stmt in schema:
        con.execute(stmt)
    rows = set(con.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"))
    con.close()
    return rows


_MASTER, _MASTER_V1 = _reference_master(SCHEMA), _reference_master(SCHEMA_V1)


def check_header(path: Path) -> None:
    """Raise :class:`IndexDamaged` if ``path`` has no SQLite header or is shorter than its
    header says (truncated). Skipped while a ``-wal`` file exists (pages may live there)."""
    with open(path, "rb") as f:
        head = f.read(100)
    if not head:
        return  # an empty file is a fresh database
    if len(head) < 100 or head[:16] != _SQLITE_MAGIC:
        raise IndexDamaged("not an SQLite database (bad header)")
    if Path(f"{path}-wal").exists():
        return
    page_size = struct.unpack(">H", head[16:18])[0]
    page_size = 65536 if page_size == 1 else page_size
    change, pages, valid_for = struct.unpack(">I", head[24:28])[0], struct.unpack(">I", head[28:32])[0], \
        struct.unpack(">I", head[92:96])[0]
    if pages and change == valid_for and pages * page_size > path.stat().st_size:
        raise IndexDamaged(f"truncated: {path.stat().st_size} bytes, header says {pages * page_size}")


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
        self.has_counters = False
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
                con = _connect_readonly(self.path)
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
        if self._master() == _MASTER_V1 and not self.readonly:
            with self.transaction(patient=True):
                if self._master() == _MASTER_V1:  # another process may have just added it
                    self._con.execute(COUNTERS)
        master = self._master()
        if master != _MASTER and not (self.readonly and master == _MASTER_V1):
            raise IndexDamaged("its tables are not ragpic's index schema")
        self.has_counters = master == _MASTER
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
    def upsert(self, con: sqlite3.Connection, rows: Sequence[tuple[str, str, str, int, float]]) -> None:
        con.executemany("INSERT INTO entries (key, fingerprint, text, bytes, access) VALUES (?, ?, ?, ?, ?)"
                        " ON CONFLICT(key) DO UPDATE SET fingerprint = excluded.fingerprint,"
                        " text = excluded.text, bytes = excluded.bytes, access = excluded.access", rows)

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


def _connect_readonly(path: Path) -> sqlite3.Connection:
    """Read-only connection; ``immutable=1`` where the folder cannot even hold a lock file
    (a WAL database on a read-only mount)."""
    uri = Path(os.path.abspath(path)).as_uri()
    try:
        con = sqlite3.connect(f"{uri}?mode=ro", uri=True, check_same_thread=False, isolation_level=None)
        con.execute("SELECT count(*) FROM sqlite_master").fetchall()
        return con
    except sqlite3.OperationalError:
        return sqlite3.connect(f"{uri}?immutable=1", uri=True, check_same_thread=False, isolation_level=None)
