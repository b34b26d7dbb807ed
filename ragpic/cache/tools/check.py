"""``ragpic store check [--repair] PATH|URL``: what a store holds and what is wrong with it.

Every entry is read whole and verified (header, payload sha256, and that it is filed under
the key its content hashes to). Reported: intact entries and their bytes, corrupt
entries, orphans (temporary files of dead writers; Redis payloads without a meta key),
stored entries missing from the catalog and catalog rows without an intact entry.
Without ``repair`` nothing is written. With it, a folder is first opened as the engine
would (damaged index moved aside and rebuilt, interrupted writes settled), then corrupt
entries and orphans are deleted, uncatalogued entries catalogued and stale rows dropped.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from ragpic.cache.backends.disk import reconcile
from ragpic.cache.backends.kinds import store_kind
from ragpic.cache.tools.check_result import CheckResult, format_result
from ragpic.errors import ConfigError

__all__ = ["CheckResult", "check_store", "check_folder", "format_result"]


def check_store(spec: str, *, repair: bool = False, prefix: str = "ragpic:") -> CheckResult:
    """Check (and with ``repair`` fix) the folder or Redis store ``spec``.

    Raises:
        ConfigError: ``spec`` is not a store (empty, unknown scheme, no such folder).
    """
    kind, target = store_kind(spec)
    check = kind.tool("check")
    if check is None:
        raise ConfigError(f"store check needs a folder or a redis:// URL, not a {kind.name} store")
    return check(target, repair=repair, prefix=prefix)


def check_folder(root: str | os.PathLike[str], *, repair: bool, prefix: str = "ragpic:") -> CheckResult:
    """See the module docstring; never creates ``root``. ``prefix`` is unused (a folder's
    entries have none): it is there for the one signature of every kind's check."""
    root = Path(root)
    from ragpic.cache.backends.disk import DiskBackend
    from ragpic.cache.backends.disk.index_open import INDEX
    from ragpic.cache.backends.disk.index_db import IndexDamaged, IndexDB

    if not root.is_dir():
        raise ConfigError(f"no KV store folder at {str(root)!r}: pass the folder given as store= "
                          f"(e.g. my_index/kv)")
    result = CheckResult(target=str(root), kind="folder")
    if repair:
        backend = DiskBackend(root)
        try:
            rep = reconcile.rebuild(root, backend._db, delete=True, full=True)  # noqa: SLF001
        finally:
            backend.close()
        result.repaired = True
    else:
        live, scratch = None, IndexDB(None)
        if not (root / INDEX).is_file():
            result.notes.append(f"{INDEX} is missing; opening the store rebuilds it")
        else:
            try:
                live = IndexDB(root / INDEX, readonly=True)
                rows = live.query("SELECT key, fingerprint, text, bytes, access FROM entries")
            except (IndexDamaged, OSError, sqlite3.Error) as exc:
                result.notes.append(f"{INDEX} is damaged ({exc}); --repair moves it aside and rebuilds it")
            else:
                with scratch.transaction() as con:
                    scratch.upsert(con, rows)
            finally:
                if live is not None:
                    live.close()
        rep = reconcile.rebuild(root, scratch, delete=False, full=True)
    for name in ("entries", "bytes", "corrupt", "orphans", "orphan_bytes", "uncatalogued", "stale_rows"):
        setattr(result, name, getattr(rep, name))
    result.notes += rep.problems[:20]
    return result
