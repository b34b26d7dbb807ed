"""Opening an SQLite file that came with a folder anyone may have written: its header is
checked before SQLite parses it, and a read-only folder is read without a lock file."""

from __future__ import annotations

import os
import sqlite3
import struct
from pathlib import Path

from ragpic.errors import IndexDamaged

_SQLITE_MAGIC = b"SQLite format 3\x00"


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


def connect_readonly(path: Path) -> sqlite3.Connection:
    """Read-only connection; ``immutable=1`` where the folder cannot even hold a lock file
    (a WAL database on a read-only mount)."""
    uri = Path(os.path.abspath(path)).as_uri()
    try:
        con = sqlite3.connect(f"{uri}?mode=ro", uri=True, check_same_thread=False, isolation_level=None)
        con.execute("SELECT count(*) FROM sqlite_master").fetchall()
        return con
    except sqlite3.OperationalError:
        return sqlite3.connect(f"{uri}?immutable=1", uri=True, check_same_thread=False, isolation_level=None)
