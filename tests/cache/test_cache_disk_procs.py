"""DiskBackend under real processes and real full / read-only filesystems."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import random
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from cache_helpers import FP, chunk_tokens, die_mid_write, endless_writer, make_chunk, same_kv, writer_process
from ragpic.cache import open_store
from ragpic.cache.backends import DiskBackend
from ragpic.cache.store.breaker import Breaker
from ragpic.cache.format.entry import decode


def test_two_processes_write_concurrently(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    seeds_a, seeds_b = list(range(0, 40)), list(range(25, 65))  # 15 keys written by both
    procs = [ctx.Process(target=writer_process, args=(str(tmp_path), seeds, 1 << 30)) for seeds in (seeds_a, seeds_b)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    store = open_store(tmp_path, fingerprint=FP, memory_bytes=0)
    expected = {}
    for s in range(65):
        key, kv, text = make_chunk(s, tokens=chunk_tokens(s))
        expected[key] = (kv, text)
    got = store.get_many(list(expected))
    assert set(got) == set(expected)
    assert all(same_kv(got[k], kv) for k, (kv, _) in expected.items())
    assert store.stats().corrupt == 0
    assert store.texts() == {k: t for k, (_, t) in expected.items()}
    store.close()


def test_writer_killed_mid_write_leaves_nothing_wrong(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    for round_ in range(1):  # one round keeps the suite fast; each kill lands at a random point
        progress = tmp_path / "progress"
        before = len(progress.read_text().split()) if progress.exists() else 0
        proc = ctx.Process(target=endless_writer, args=(str(tmp_path), 1000 * round_))
        proc.start()
        deadline = time.monotonic() + 60
        while (len(progress.read_text().split()) if progress.exists() else 0) < before + 3:
            assert time.monotonic() < deadline and proc.is_alive()
            time.sleep(0.01)
        time.sleep(random.uniform(0.0, 0.02))  # land somewhere inside a later write
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
    backend = DiskBackend(tmp_path)
    keys = backend.keys()
    assert len(keys) >= 3
    done = [int(x) for x in (tmp_path / "progress").read_text().split()]
    written = {}
    for s in [*done, max(done) + 1]:  # every finished write plus the one that was killed
        key, kv, text = make_chunk(s, tokens=3000, layers=4, heads=2, head_dim=16)
        written[key] = kv
    for key, data in zip(keys, backend.get_many(keys)):
        assert data is not None and key in written
        kv, _ = decode(data, fingerprint=FP)  # raises if a half value were readable
        assert same_kv(kv, written[key])
    backend.close()


def test_kill_inside_value_file_write_is_a_miss(tmp_path: Path) -> None:
    proc = mp.get_context("spawn").Process(target=die_mid_write, args=(str(tmp_path),))
    proc.start()
    proc.join(timeout=120)
    assert proc.exitcode == -signal.SIGKILL
    entries = tmp_path / "entries"
    assert len(list(entries.rglob("*.rpkv"))) == 1 and len(list(entries.rglob("*.tmp"))) == 1  # + the half file
    store = open_store(tmp_path, fingerprint=FP, memory_bytes=0)
    assert list(entries.rglob("*.tmp")) == []  # the dead writer's half file was reclaimed on open
    (k0, kv0, _), (k1, _, _) = make_chunk(0, tokens=300), make_chunk(1, tokens=300)
    got = store.get_many([k0, k1])
    assert list(got) == [k0] and same_kv(got[k0], kv0)
    assert store.stats().corrupt == 0 and not store.contains_many([k1])[0]
    store.close()


@pytest.fixture
def tmpfs(tmp_path: Path):
    """A 3 MiB tmpfs: a real filesystem that fills up (needs root / CAP_SYS_ADMIN)."""
    mnt = tmp_path / f"mnt-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill up ({r.stderr.strip() or 'not root'})")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_degrades_to_misses(tmpfs: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = open_store(tmpfs / "kv", fingerprint=FP, memory_bytes=0)
    store.breaker = Breaker(0.0, 0.0)  # retry every write: each one must fail cleanly
    keys = []
    with caplog.at_level(logging.WARNING, logger="ragpic.cache"):
        for s in range(40):  # ~150 KiB each: ~6 MiB into 3 MiB
            keys += list(_put(store, s))
    st = store.stats()
    assert st.errors > 0 and 0 < st.puts < 40
    assert "failed" in caplog.text and ("No space left" in caplog.text or "disk is full" in caplog.text)
    got = store.get_many(keys)  # what made it in reads back intact; the rest are misses
    assert 0 < len(got) < 40 and store.stats().corrupt == 0
    # failed writes left no half-written value files behind to keep the disk full
    files = list((tmpfs / "kv" / "entries").rglob("*.rpkv"))
    assert len(files) == store.backend.stats()["entries"] == len(got)
    store.close()


def _put(store, s: int) -> list[str]:
    key, kv, text = make_chunk(s, tokens=300)
    store.put_many({key: (kv, text)})
    return [key]


def test_read_only_folder_degrades(tmp_path: Path, tmpfs: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = open_store(tmpfs / "kv", fingerprint=FP, memory_bytes=0)
    first = _put(store, 1)
    store.close()
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "--bind", str(tmpfs), str(ro)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
        with caplog.at_level(logging.WARNING, logger="ragpic.cache"):
            store = open_store(ro / "kv", fingerprint=FP)
            second = _put(store, 2)  # no exception: kept in memory
            got = store.get_many(first + second)
        assert "read-only" in caplog.text and store.stats().errors == 1
        assert set(got) == {*first, *second}  # the folder's entry still serves reads
        store.close()
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)
