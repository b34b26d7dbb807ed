"""The folder store: entry files named by their key, a SQLite index that heals on open.

``backend`` (:class:`DiskBackend`), ``folder`` (the only file operations), ``index_db`` /
``index_open`` / ``reconcile`` (the index, opened so that it heals, rebuilt from the files),
``manifest`` and ``legacy`` (importing a ragpic 0.1 folder without unpickling).
"""

from ragpic.cache.backends.disk.backend import DEFAULT_SIZE_LIMIT, DiskBackend

__all__ = ["DEFAULT_SIZE_LIMIT", "DiskBackend"]
