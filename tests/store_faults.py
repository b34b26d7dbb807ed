"""Fault injection for the store tests (docs/RESULTS.md §6): forged entries, crafted legacy folders,
real small / read-only filesystems, and worker processes that die at chosen points.

Everything here plays the attacker or the accident; the tests assert the store's answer.
Worker functions live here (not in test modules) so spawn children import them cheaply.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import signal
import sqlite3
import struct
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cache_helpers import FP, make_chunk
from ragpic.cache.format.entry import encode
from ragpic.cache.format.entry_header import read_header

_PREFIX = struct.Struct("<4sHI16s")


def forge(data: bytes, *, header: dict | None = None, raw_header: bytes | None = None,
          payload: bytes | None = None) -> bytes:
    """Entry bytes rewritten as an attacker with write access would: fields of the header
    replaced (or the whole header bytes), payload replaced, every checksum recomputed."""
    head, start = read_header(data)
    body = payload if payload is not None else data[start:]
    head = {**head, **(header or {}), "payload_bytes": len(body) if payload is not None else head["payload_bytes"],
            "payload_sha256": hashlib.sha256(body).hexdigest()}
    hbytes = raw_header if raw_header is not None else json.dumps(head, ensure_ascii=False).encode()
    magic, version, _, _ = _PREFIX.unpack_from(data, 0)
    return _PREFIX.pack(magic, version, len(hbytes), hashlib.sha256(hbytes).digest()[:16]) + hbytes + body


def nested_json(depth: int = 100_000) -> bytes:
    """A header of JSON arrays nested ``depth`` deep (``json.loads`` raises RecursionError)."""
    return b"[" * depth + b"]" * depth


class Boom:
    """Unpickling this creates ``marker``: proof that code from the folder ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def crafted_legacy_folder(root: Path, marker: Path, victims: list[Path]) -> dict[str, bytes]:
    """A ragpic 0.1 store at ``root`` (diskcache layout, ``kv/cache.db``) holding two intact
    entries (inline and in a value file), a pickle-mode row and a pickled-key row whose
    unpickling creates ``marker``, and rows whose file names point at ``victims`` outside
    (by absolute path and by ``../``). Returns the intact entries ``key -> bytes``."""
    kv = root / "kv"
    (kv / "ab").mkdir(parents=True)
    con = sqlite3.connect(kv / "cache.db")
    con.execute("CREATE TABLE Settings (key TEXT NOT NULL UNIQUE, value)")
    con.execute("CREATE TABLE Cache (rowid INTEGER PRIMARY KEY, key BLOB, raw INTEGER, store_time REAL,"
                " expire_time REAL, access_time REAL, access_count INTEGER DEFAULT 0, tag BLOB,"
                " size INTEGER DEFAULT 0, mode INTEGER DEFAULT 0, filename TEXT, value BLOB)")
    intact = {}
    for seed, tokens in ((1, 4), (2, 300)):
        key, kv_, text = make_chunk(seed, tokens=tokens)
        intact[key] = encode(kv_, text=text)
    (k_inline, inline), (k_file, filed) = intact.items()
    (kv / "ab" / "entry.val").write_bytes(filed)
    boom = pickle.dumps(Boom(marker))
    rows = [(k_inline, 1, 1, None, inline), (k_file, 1, 2, "ab/entry.val", None),
            (make_chunk(3)[0], 1, 4, None, boom),          # value in pickle mode
            (boom, 0, 1, None, b"x")]                      # a pickled key: the key scan unpickles it
    for i, victim in enumerate(victims):
        name = str(victim) if i % 2 == 0 else os.path.relpath(victim, kv)
        rows.append((make_chunk(10 + i)[0], 1, 2, name, None))
    con.executemany("INSERT INTO Cache (key, raw, mode, filename, value, store_time, access_time)"
                    " VALUES (?, ?, ?, ?, ?, 0, 0)", rows)
    con.commit()
    con.close()
    return intact


@contextlib.contextmanager
def tmpfs(parent: Path, size: str = "3m") -> Iterator[Path]:
    """A real tmpfs of ``size`` that fills up; skips the test when it cannot be mounted."""
    mnt = parent / f"tmpfs-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs to fill up ({r.stderr.strip() or 'needs root'})")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@contextlib.contextmanager
def read_only_view(src: Path, parent: Path) -> Iterator[Path]:
    """``src`` seen through a read-only bind mount (root ignores chmod, a mount it cannot)."""
    view = parent / f"ro-{uuid.uuid4().hex[:6]}"
    view.mkdir()
    r = subprocess.run(["mount", "--bind", str(src), str(view)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot bind-mount a read-only view ({r.stderr.strip() or 'needs root'})")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
        yield view
    finally:
        subprocess.run(["umount", "-l", str(view)], check=False)


def fill_disk(folder: Path) -> None:
    """Write a ballast file until the filesystem holding ``folder`` has no space left."""
    with open(folder / "ballast", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def die_between_entry_and_catalog(path: str, seeds: list[int], die_at: int) -> None:
    """Store ``seeds`` one put each; at the ``die_at``-th put, SIGKILL this process right
    after the entry file is in place and before its catalog row is committed."""
    import torch

    torch.set_num_threads(1)
    from ragpic.cache import open_store
    from ragpic.cache.backends.disk import folder

    original, calls = folder.write_entry, []

    def write_then_die(root, key, data, writer):
        size = original(root, key, data, writer)
        calls.append(key)
        if len(calls) == die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return size

    folder.write_entry = write_then_die
    store = open_store(path, fingerprint=FP, memory_bytes=0)
    for s in seeds:
        key, kv, text = make_chunk(s, tokens=64)
        store.put_many({key: (kv, text)})
