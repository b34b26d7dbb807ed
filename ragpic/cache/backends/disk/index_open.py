"""Opening a folder store's index so that it heals (see :mod:`ragpic.cache.backends.disk`).

Pure functions over the folder ``root``: each returns the :class:`IndexDB` to use and, when
the folder turned out not writable, why (``None`` when it is).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from ragpic.cache.backends.disk import folder, legacy, reconcile
from ragpic.cache.backends.disk.index_db import IndexDamaged, IndexDB

log = logging.getLogger("ragpic.cache")

INDEX = "index.sqlite"


def open_index(root: Path, *, why_readonly: str | None, busy_s: float,
               orphan_age_s: float) -> tuple[IndexDB, str | None]:
    """The folder's index: opened, or rebuilt if damaged or missing, or (read-only folder)
    opened read-only, or rebuilt in memory from the entry files."""
    db_path = root / INDEX
    if why_readonly is None:
        fresh = not db_path.exists()
        try:
            try:
                db = IndexDB(db_path, busy_s=busy_s)
            except IndexDamaged as exc:
                return recover(root, str(exc), busy_s=busy_s, orphan_age_s=orphan_age_s), None
            if fresh and (root / folder.ENTRIES).is_dir():
                rebuild_logged(root, db, f"{INDEX} was missing", delete=True, orphan_age_s=orphan_age_s)
            return db, None
        except (OSError, sqlite3.Error, IndexDamaged) as exc:  # e.g. no space for a new database
            why_readonly = why_unwritable(root, exc)
    try:
        if db_path.is_file():
            return IndexDB(db_path, readonly=True), why_readonly
    except (IndexDamaged, OSError, sqlite3.Error) as exc:
        log.warning("KV store %s: %s is unreadable (%s)", root, INDEX, exc)
    db = IndexDB(None)
    rebuild_logged(root, db, "", delete=False, orphan_age_s=orphan_age_s, quiet=True)
    return db, why_readonly


def why_unwritable(root: Path, exc: BaseException) -> str:
    """Why writing failed, in words: a full disk says so (SQLite only says "disk I/O error")."""
    try:
        full = os.statvfs(root).f_bavail == 0
    except OSError:
        full = False
    return "the disk is full (No space left on device)" if full else f"its index cannot be written ({exc})"


def recover(root: Path, cause: str, *, busy_s: float, orphan_age_s: float) -> IndexDB:
    """Move the damaged database (and its -wal/-shm) to ``damaged/``, rebuild it, warn."""
    aside = root / "damaged" / f"index-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.sqlite"
    aside.parent.mkdir(exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        src = root / f"{INDEX}{suffix}"
        if src.is_symlink():
            src.unlink()  # never follow a planted link out of the folder
        elif src.exists():
            os.replace(src, f"{aside}{suffix}")
    db = IndexDB(root / INDEX, busy_s=busy_s)
    rebuild_logged(root, db, f"{INDEX} was damaged ({cause}); it was moved to {aside}", delete=True,
                   orphan_age_s=orphan_age_s)
    return db


def replace_damaged(root: Path, db: IndexDB, exc: Exception, *, why_readonly: str | None, busy_s: float,
                    orphan_age_s: float) -> tuple[IndexDB, str | None]:
    """The open index turned out damaged while in use: replace it, unless another process
    already has (the file at the path is then a different one), or rebuild it in memory."""
    log.warning("KV store %s: %s is damaged (%s)", root, INDEX, exc)
    db.close()
    db_path = root / INDEX
    try:
        if why_readonly is None and db_path.exists() and db_path.stat().st_ino != db.inode:
            return IndexDB(db_path, busy_s=busy_s), None
        if why_readonly is None:
            return recover(root, str(exc), busy_s=busy_s, orphan_age_s=orphan_age_s), None
    except (OSError, sqlite3.Error, IndexDamaged):
        why_readonly = f"its index is damaged ({exc})"
    mem = IndexDB(None)
    rebuild_logged(root, mem, "", delete=False, orphan_age_s=orphan_age_s, quiet=True)
    return mem, why_readonly


def rebuild_logged(root: Path, db: IndexDB, cause: str, *, delete: bool, orphan_age_s: float,
                   quiet: bool = False) -> None:
    """:func:`reconcile.rebuild` plus one warning saying what was kept (unless ``quiet``)."""
    rep = reconcile.rebuild(root, db, delete=delete, orphan_age_s=orphan_age_s)
    if not quiet or rep.corrupt:
        log.warning("KV store %s: %s; rebuilt the index from %d intact entry files (%d bytes), "
                    "%s %d damaged and %d orphaned files", root, cause or "index rebuilt", rep.entries, rep.bytes,
                    "deleted" if delete else "found", rep.corrupt, rep.orphans)


def heal_on_open(root: Path, db: IndexDB, put: Callable[[str, bytes], None], *, orphan_age_s: float) -> None:
    """Settle interrupted writes, import a ragpic 0.1 folder and move in a text index kept
    beside the folder; a full disk or a held lock only postpones this to the next open."""
    try:
        adopted, deleted = reconcile.finish_pending(root, db, orphan_age_s=orphan_age_s)
        if adopted or deleted:
            log.warning("KV store %s: settled interrupted writes: catalogued %d stored entries, "
                        "deleted %d orphaned files", root, adopted, deleted)
        if legacy.legacy_db(root).is_file():
            legacy.import_folder(root, put)
        legacy.move_side_index(root)
    except (OSError, sqlite3.OperationalError) as exc:
        log.warning("KV store %s: could not settle interrupted writes yet (%s)", root, exc)
