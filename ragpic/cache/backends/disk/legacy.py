"""Import a ragpic 0.1 folder store (a diskcache folder under ``kv/``) without diskcache, and
move in the text index an older ragpic kept beside the folder (:func:`move_side_index`).

ragpic 0.1 kept entries in ``<store>/kv/`` through diskcache, whose reads unpickle any row
in pickle mode and whose key scan unpickles non-string keys: a crafted ``cache.db`` ran
code in every process that opened the folder. This module reads that table with plain SQL
instead and takes only what ragpic itself wrote there: string keys that are chunk keys,
bytes stored inline (``mode`` 1) or in a value file (``mode`` 2) whose name lies inside
``kv/``. Every entry is then verified (checksums, key) like any other before it is
written in the current layout. Nothing else of the row is interpreted. The old folder is
then moved aside (``legacy/`` when read, ``damaged/`` when unreadable), never deleted.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ragpic.cache.backends.disk import folder
from ragpic.cache.format.entry_header import CorruptEntry, verify
from ragpic.cache.format.keys import chunk_key

log = logging.getLogger("ragpic.cache")

_MODE_RAW, _MODE_BINARY = 1, 2


def legacy_db(root: Path) -> Path:
    return root / "kv" / "cache.db"


def _value_file(kv_dir: Path, name: object) -> bytes | None:
    """Bytes of a diskcache value file, only if ``name`` is a plain relative path that
    resolves inside ``kv_dir`` to a regular file (no ``..``, no absolute path, no symlink)."""
    if not isinstance(name, str) or not name or os.path.isabs(name) or ".." in Path(name).parts:
        return None
    path = kv_dir / name
    real_dir, real = os.path.realpath(kv_dir), os.path.realpath(path)
    if os.path.commonpath([real_dir, real]) != real_dir or real == real_dir:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read() if stat.S_ISREG(os.fstat(f.fileno()).st_mode) else None


def rows(root: Path) -> Iterator[tuple[str, bytes | None]]:
    """``(key, entry bytes)`` for each row ragpic 0.1 could have written; ``None`` bytes
    for every other row (pickle mode, pickled key, a file name leading out of ``kv/``).

    Raises:
        sqlite3.DatabaseError: ``cache.db`` is unreadable.
    """
    kv_dir = root / "kv"
    uri = Path(os.path.abspath(legacy_db(root))).as_uri()
    con = sqlite3.connect(f"{uri}?mode=ro", uri=True)
    try:
        con.execute("PRAGMA trusted_schema=OFF")
        for key, raw, mode, filename, value in con.execute("SELECT key, raw, mode, filename, value FROM Cache"):
            if raw != 1 or not folder.is_key(key):  # a pickled key (raw 0) is never looked at
                yield "", None
            elif mode == _MODE_RAW and isinstance(value, bytes):
                yield key, value
            elif mode == _MODE_BINARY:
                yield key, _value_file(kv_dir, filename)
            else:
                yield key, None  # pickle, text or unknown mode: never read
    finally:
        con.close()


def import_folder(root: Path, put: Callable[[str, bytes], None]) -> None:
    """Copy every intact legacy entry with ``put(key, data)``, then move ``kv/`` aside.
    Logs one warning saying what was kept and where the old folder went."""
    kept = skipped = 0
    aside, why = "legacy", ""
    try:
        for key, data in rows(root):
            if data is None:
                skipped += 1
                continue
            try:
                header, _ = verify(data)
                if chunk_key(header["fingerprint"], header["text"], header["recipe"], header["dtype"]) != key:
                    raise CorruptEntry("misfiled")
            except CorruptEntry:
                skipped += 1
                continue
            put(key, data)
            kept += 1
    except sqlite3.DatabaseError as exc:
        aside, why = "damaged", f" (its cache.db is unreadable: {exc})"
    target = root / aside / f"diskcache-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    target.parent.mkdir(exist_ok=True)
    os.replace(root / "kv", target)
    for name in ("catalog.sqlite", "catalog.sqlite-wal", "catalog.sqlite-shm"):  # 0.1's side catalog
        if (root / name).is_file() and not (root / name).is_symlink():
            os.replace(root / name, target / name)
    log.warning("KV store %s: imported %d entries of a ragpic 0.1 (diskcache) folder without unpickling, "
                "skipped %d rows that were not intact ragpic entries%s; the old folder is now %s "
                "(delete it to free its space)", root, kept, skipped, why, target)


SIDE_INDEX = ".text-index.sqlite"  # an older ragpic's text index: ``<folder>.text-index.sqlite``


def side_index(root: Path) -> Path:
    """Where an older ragpic kept ``root``'s text index: beside the folder, not in it."""
    return root.with_name(root.name + SIDE_INDEX)


def move_side_index(root: Path) -> None:
    """Move a text index found beside ``root`` (and its -wal/-shm) into ``root/legacy/``.

    Its rows are now the ``anchors`` of ``index.sqlite``, derived from the catalog, so nothing
    is read from it; it is moved, never deleted (as the 0.1 folder is), and never followed
    when it is a symlink. A folder on another filesystem than its parent keeps it (one warning).
    """
    side = side_index(root)
    if side.is_symlink() or not side.is_file():
        return
    target = root / "legacy" / f"text-index-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.sqlite"
    try:
        target.parent.mkdir(exist_ok=True)
        for suffix in ("", "-wal", "-shm"):
            src = Path(f"{side}{suffix}")
            if src.is_file() and not src.is_symlink():
                os.replace(src, f"{target}{suffix}")
    except OSError as exc:
        log.warning("KV store %s: could not move the old text index %s into the folder (%s)", root, side, exc)
        return
    log.warning("KV store %s: the text index an older ragpic kept beside the folder (%s) is now %s; the "
                "store keeps its text index inside index.sqlite (delete the old file to free its space)",
                root, side, target)
