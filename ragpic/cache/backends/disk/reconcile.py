"""Make a folder store's index agree with its entry files: inspect, rebuild, finish writes.

The entry files are the truth (each header names its fingerprint and text, and its key is
the hash of both); ``index.sqlite`` is derived from them. Three repairs:

- :func:`rebuild`: scan every file (after a damaged or deleted database, or ``ragpic store
  check --repair``): intact entries get a row, damaged ones and orphaned temporary files
  are deleted (when ``delete`` is set), rows without a file are dropped.
- :func:`finish_pending`: on open, the keys of writes whose writer died (``pending`` rows)
  are settled one by one: a complete file is catalogued, temporary files are deleted. This
  costs O(interrupted writes), not O(store).
- :func:`inspect`: one file's header (and with ``full`` its payload checksum) checked
  against the key it is filed under.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ragpic.cache.backends.disk import folder
from ragpic.cache.format.entry_header import PREFIX, CorruptEntry, payload_size, read_header, verify
from ragpic.cache.backends.disk.index_db import IndexDB
from ragpic.cache.format.keys import chunk_key

log = logging.getLogger("ragpic.cache")



@dataclass(slots=True)
class Report:
    """What a scan found (and, with ``delete``, removed)."""

    entries: int = 0
    bytes: int = 0
    corrupt: int = 0
    orphans: int = 0
    orphan_bytes: int = 0
    uncatalogued: int = 0
    stale_rows: int = 0
    other: int = 0
    problems: list[str] = field(default_factory=list)


def inspect(root: Path, key: str, *, full: bool = False) -> tuple[str, str, int]:
    """``(fingerprint, text, size)`` of ``key``'s entry file.

    Reads only the prefix and header unless ``full`` (then the payload's sha256 too); the
    file size must match the header, and the header must hash to ``key``.

    Raises:
        CorruptEntry: anything wrong (message says what); FileNotFoundError: no such file.
    """
    if full:
        data = folder.read_entry(root, key)
        if data is None:
            raise FileNotFoundError(key)
        header, _ = verify(data)
        size = len(data)
    else:
        header, size = read_head(root, key)
    if chunk_key(header["fingerprint"], header["text"], header["recipe"], header["dtype"]) != key:
        raise CorruptEntry("entry holds another chunk than its file name says (misfiled)")
    return header["fingerprint"], header["text"], size


def read_head(root: Path, key: str) -> tuple[dict, int]:
    """``(header, file size)`` of an entry file, reading only its prefix and header."""
    path = folder.entry_path(root, key)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        prefix = f.read(PREFIX.size)
        hlen = PREFIX.unpack(prefix)[2] if len(prefix) == PREFIX.size else 0
        header, start = read_header(prefix + f.read(min(hlen, 64 * 2**20)))
    if size != start + payload_size(header):
        raise CorruptEntry(f"file is {size} bytes, header says {start + payload_size(header)} (truncated or padded)")
    return header, size


def _try_remove(path: Path, report: Report, delete: bool) -> None:
    if delete:
        try:
            os.unlink(path)
        except OSError as exc:
            report.problems.append(f"cannot delete {path.name}: {exc}")


def rebuild(root: Path, db: IndexDB, *, delete: bool, full: bool = False, orphan_age_s: float = 3600.0) -> Report:
    """Scan every file under ``root/entries`` into ``db`` (see the module docstring)."""
    report = Report()
    rows: list[tuple[str, str, str, int, float]] = []
    now = time.time()
    for kind, key, path in folder.scan(root):
        if kind == "other":
            report.other += 1
            continue
        if kind == "tmp":
            st = path.lstat()
            if folder.stale_writer(folder.tmp_writer(path), st.st_mtime, max_age_s=orphan_age_s):
                report.orphans += 1
                report.orphan_bytes += st.st_size
                _try_remove(path, report, delete)
            continue
        try:
            fp, text, size = inspect(root, key, full=full)
        except (CorruptEntry, ValueError, OSError) as exc:
            report.corrupt += 1
            report.problems.append(f"{key}: {exc}")
            _try_remove(path, report, delete)
            continue
        report.entries += 1
        report.bytes += size
        rows.append((key, fp, text, size, now))
    if not db.readonly or db.path is None:
        known = {k for (k,) in db.query("SELECT key FROM entries")}
        present = {r[0] for r in rows}
        report.uncatalogued = len(present - known)
        stale = sorted(known - present)
        report.stale_rows = len(stale)
        with db.transaction() as con:
            con.executemany("DELETE FROM entries WHERE key = ?", [(k,) for k in stale])
            db.insert_new(con, [r for r in rows if r[0] not in known])
    return report


def finish_pending(root: Path, db: IndexDB, *, orphan_age_s: float) -> tuple[int, int]:
    """Settle writes whose writer is gone; return ``(entries catalogued, files deleted)``."""
    adopted = deleted = 0
    for key, writer, started in db.query("SELECT key, writer, started FROM pending"):
        if not folder.stale_writer(writer, started, max_age_s=orphan_age_s):
            continue
        for tmp in folder.temp_files(root, key):
            if folder.tmp_writer(tmp) == writer:
                tmp.unlink(missing_ok=True)
                deleted += 1
        row = None
        try:
            fp, text, size = inspect(root, key)
            row = (key, fp, text, size, time.time())
        except FileNotFoundError:
            pass
        except (CorruptEntry, ValueError, OSError) as exc:
            log.warning("KV entry %s was left damaged by an interrupted write (%s); deleted", key, exc)
            deleted += int(folder.remove_entry(root, key))
        with db.transaction() as con:
            if row is not None:
                adopted += con.execute("SELECT count(*) FROM entries WHERE key = ?", (key,)).fetchone()[0] == 0
                db.upsert(con, [row])
            con.execute("DELETE FROM pending WHERE key = ? AND writer = ?", (key, writer))
    return adopted, deleted
