"""Where a folder store keeps entry files, and the only file operations it performs on them.

Layout under the store folder ``root``::

    entries/<k[:2]>/<k>.rpkv                 one entry (ragpic.cache.format.entry bytes) per key k
    entries/<k[:2]>/<k>.<writer>.tmp         an entry being written by ``writer``

A file name is never read from a database: it is derived from a key, and a key is only
used once it is 64 lowercase hex characters (what :func:`ragpic.cache.format.keys.chunk_key`
makes). Every path is also checked to resolve inside ``root`` (a symlinked ``entries/``
or shard folder pointing elsewhere is refused) and files are opened with ``O_NOFOLLOW``,
so nothing outside the folder is ever read, written or deleted.

Writes are atomic: bytes go to a uniquely named temporary file that is then renamed over
the entry's name, so a reader sees the whole entry or none. A writer killed mid-write
leaves only its ``.tmp`` file, which :func:`stale_writer` recognises as an orphan.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from ragpic.errors import UnsafePath  # raised here; defined with ragpic's other errors

ENTRIES = "entries"
SUFFIX = ".rpkv"
_KEY = re.compile(r"[0-9a-f]{64}")
_TMP = re.compile(r"([0-9a-f]{64})\.([A-Za-z0-9_.-]+)\.tmp")
_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40] or "host"


def is_key(key: object) -> bool:
    """Whether ``key`` is a ragpic chunk key (64 lowercase hex characters)."""
    return isinstance(key, str) and _KEY.fullmatch(key) is not None


def _inside(root: Path, path: Path) -> Path:
    """``path`` if its real location lies inside ``root``'s; else :class:`UnsafePath`."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if os.path.commonpath([real_root, real]) != real_root or real == real_root:
        raise UnsafePath(f"{path} resolves to {real}, outside the store folder {real_root}")
    return path


def entry_path(root: str | os.PathLike[str], key: str) -> Path:
    """The file of ``key``'s entry under ``root``.

    Raises:
        UnsafePath: ``key`` is not a chunk key, or the path resolves outside ``root``.
    """
    if not is_key(key):
        raise UnsafePath(f"{key!r} is not a ragpic chunk key (64 lowercase hex characters)")
    root = Path(root)
    return _inside(root, root / ENTRIES / key[:2] / f"{key}{SUFFIX}")


def writer_id() -> str:
    """A token naming this process's temporary files: ``<host>-<pid>-<random>``."""
    return f"{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _safe(root: str | os.PathLike[str], key: str) -> Path | None:
    """:func:`entry_path`, or ``None`` where it would leave the folder (a planted symlink
    reads as a missing entry: it must neither raise into a query nor be followed)."""
    try:
        return entry_path(root, key)
    except UnsafePath:
        return None


def read_entry(root: str | os.PathLike[str], key: str) -> bytes | None:
    """The bytes of ``key``'s entry file, ``None`` if absent (a symlink, a non-file or a
    path leading out of the folder counts as absent)."""
    path = _safe(root, key)
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == getattr(os, "ELOOP", -1):  # a symlink planted in place of an entry
            return None
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        return f.read()


def entry_size(root: str | os.PathLike[str], key: str) -> int | None:
    """Size in bytes of ``key``'s entry file (not following symlinks), ``None`` if absent."""
    path = _safe(root, key)
    if path is None:
        return None
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def write_entry(root: str | os.PathLike[str], key: str, data: bytes, writer: str) -> int:
    """Write ``data`` as ``key``'s entry atomically (temporary file, then rename); return its size.

    A failure (disk full, read-only folder) removes the temporary file and re-raises.

    Raises:
        OSError: from the filesystem; UnsafePath: see :func:`entry_path`.
    """
    final = entry_path(root, key)
    final.parent.mkdir(parents=True, exist_ok=True)
    _inside(Path(root), final.parent)  # re-check: the shard folder may have just been made
    tmp = final.with_name(f"{key}.{writer}.tmp")
    try:
        _write_bytes(tmp, data)
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return len(data)


def _write_bytes(path: Path, data: bytes) -> None:
    """Create ``path`` exclusively (never following a planted symlink) and write ``data``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def remove_entry(root: str | os.PathLike[str], key: str) -> bool:
    """Delete ``key``'s entry file if it is a regular file inside ``root``; whether one was removed."""
    path = _safe(root, key)
    if path is None or entry_size(root, key) is None:
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def temp_files(root: str | os.PathLike[str], key: str) -> list[Path]:
    """Temporary files of ``key`` left by any writer (``<key>.<writer>.tmp``)."""
    path = _safe(root, key)
    if path is None:
        return []
    shard = path.parent
    try:
        names = os.listdir(shard)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [shard / n for n in names if n.startswith(key + ".") and n.endswith(".tmp") and _TMP.fullmatch(n)]


def stale_writer(writer: str, started: float, *, max_age_s: float) -> bool:
    """Whether ``writer`` (see :func:`writer_id`) can no longer finish a write it began at
    ``started`` (epoch seconds): a process of this host that is gone, or any writer older
    than ``max_age_s`` (other hosts' processes cannot be asked)."""
    host, pid, _ = (writer.rsplit("-", 2) + ["", ""])[:3]
    if host == _HOST and pid.isdigit():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, owned by someone else
            pass
    return time.time() - started > max_age_s


def scan(root: str | os.PathLike[str]) -> Iterator[tuple[str, str, Path]]:
    """Every file under ``entries/``: ``("entry", key, path)``, ``("tmp", key, path)`` or
    ``("other", "", path)``. Symlinks and folders are reported as ``other``, never followed."""
    base = Path(root) / ENTRIES
    if not base.is_dir() or base.is_symlink():
        return
    for shard in sorted(os.scandir(base), key=lambda e: e.name):
        if not shard.is_dir(follow_symlinks=False):
            yield "other", "", Path(shard.path)
            continue
        for item in os.scandir(shard.path):
            path = Path(item.path)
            if not item.is_file(follow_symlinks=False):
                yield "other", "", path
            elif item.name.endswith(SUFFIX) and is_key(item.name[: -len(SUFFIX)]) \
                    and item.name[:2] == shard.name:
                yield "entry", item.name[: -len(SUFFIX)], path
            elif (m := _TMP.fullmatch(item.name)) is not None:
                yield "tmp", m.group(1), path
            else:
                yield "other", "", path


def tmp_writer(path: Path) -> str:
    """The writer token in a temporary file's name (see :func:`write_entry`)."""
    m = _TMP.fullmatch(path.name)
    return m.group(2) if m else ""
