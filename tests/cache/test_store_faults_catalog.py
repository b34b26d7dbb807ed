"""The catalog (docs/RESULTS.md §6) never disagrees with the entries for long, and every
damage heals.

kill -9 between entry and catalog writes, a disk that fills mid-ingest, a deleted or
damaged database, a read-only mount, a full disk, a bad manifest.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import signal
import subprocess
from pathlib import Path

import pytest

from cache_helpers import FP, make_chunk
from ragpic import Config, RagPic
from ragpic.cache import open_store
from ragpic.cache.backends.disk.folder import entry_path
from ragpic.errors import ConfigError, StoreError
from store_faults import die_between_entry_and_catalog, fill_disk, read_only_view, tmpfs
from tiny import TEXT, tiny_lm

WORDS = TEXT.split()


def passage(i: int, words: int = 60) -> str:
    """A distinct ~190-token chunk (~97 KB of tiny-model KV)."""
    return f"passage {i}: " + " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(words))


@pytest.fixture(scope="module")
def lm():
    return tiny_lm()


def _engine(lm, store: Path) -> RagPic:
    # exact entries: the disk-full test sizes its tmpfs so that they fill it mid-batch
    return RagPic(Config(store=str(store), max_new_tokens=2, kv_quant="none"), lm=lm)


def _fill(path: Path, n: int = 12) -> dict[str, str]:
    store = open_store(path, fingerprint=FP)
    items = {k: (kv, t) for k, kv, t in (make_chunk(s, tokens=64) for s in range(n))}
    store.put_many(items)
    store.close()
    return {k: t for k, (_, t) in items.items()}


def _serves(path: Path, texts: dict[str, str], **kw) -> None:
    """Every entry is found by the catalog and reads back: nothing lost."""
    store = open_store(path, fingerprint=FP, memory_bytes=0, **kw)
    assert store.texts() == texts
    assert set(store.get_many(list(texts))) == set(texts) and store.stats().corrupt == 0
    store.close()


def test_kill9_between_entry_and_catalog_is_settled_on_open(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ctx = mp.get_context("spawn")
    for seeds, die_at in ((range(0, 8), 5), (range(8, 16), 3)):
        proc = ctx.Process(target=die_between_entry_and_catalog, args=(str(tmp_path), list(seeds), die_at))
        proc.start()
        proc.join(timeout=120)
        assert proc.exitcode == -signal.SIGKILL
    written = [make_chunk(s, tokens=64) for s in [*range(0, 5), *range(8, 11)]]
    with caplog.at_level(logging.WARNING, logger="ragpic.cache"):
        _serves(tmp_path, {k: t for k, _, t in written})
    # the second writer settled the first one's interrupted write when it opened the folder
    assert "settled interrupted writes: catalogued 1 stored entries" in caplog.text


def test_disk_filling_mid_ingest_raises_and_keeps_what_it_stored(tmp_path: Path, lm) -> None:
    texts = [passage(i) for i in range(60)]
    with tmpfs(tmp_path, "3m") as mnt:
        engine = _engine(lm, mnt / "kv")
        with pytest.raises(StoreError) as err:
            engine.compile(texts)
        msg = str(err.value)
        assert msg.startswith("chunk 'passage ") and "could not be stored" in msg
        assert "No space left on device" in msg or "disk is full" in msg
        assert "free space, lower store_size_limit_gb or point store= at a bigger disk" in msg
        stored = [k for k in map(engine.chunk_key, texts) if engine.store.backend.contains(k)]
        assert 10 < len(stored) < 50 and f"{len(stored)} of the 60 chunks of this batch were stored" in msg
        engine.store.close()
        restarted = _engine(lm, mnt / "kv")  # a new process: everything stored is catalogued
        assert set(restarted.store.texts()) == set(stored)
        g = restarted.generate(f"Read this. {texts[0]} What now?")  # no hints: found by the catalog
        assert (g.chunks_matched, g.chunks_loaded, g.chunks_compiled) == (1, 1, 0)
        subprocess.run(["mount", "-o", "remount,size=32m", str(mnt)], check=True)
        assert restarted.compile(texts) == 60 - len(stored)  # only what was missing
        assert len(restarted.store.texts(refresh=True)) == 60


def test_compile_recatalogues_stored_but_uncatalogued_chunks(tmp_path: Path, lm,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    engine = _engine(lm, tmp_path)
    texts = [passage(i) for i in range(4)]
    assert engine.compile(texts) == 4
    engine.store.backend._db.query("DELETE FROM entries")  # the catalog loses every row
    engine.store.close()
    again = _engine(lm, tmp_path)
    assert again.store.texts() == {}
    with caplog.at_level(logging.WARNING, logger="ragpic.cache"):
        assert again.compile(texts) == 0  # stored already: nothing recompiled...
    assert "4 stored chunks were missing from the catalog; catalogued them again" in caplog.text
    assert set(again.store.texts(refresh=True)) == set(map(again.chunk_key, texts))  # ...and found again


def test_deleted_database_is_rebuilt_from_the_entries(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    texts = _fill(tmp_path)
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"index.sqlite{suffix}").unlink(missing_ok=True)
    with caplog.at_level(logging.WARNING, logger="ragpic.cache"):
        _serves(tmp_path, texts)
    assert "index.sqlite was missing; rebuilt the index from 12 intact entry files" in caplog.text


def _damage_db(path: Path, how: str) -> None:
    db = path / "index.sqlite"
    data = bytearray(db.read_bytes())
    if how == "garbage header":
        data[:100] = os.urandom(100)
    elif how == "truncated":
        data = data[: len(data) // 2]
    elif how == "garbage pages":
        data[4096:] = b"\x5a" * (len(data) - 4096)
    elif how == "foreign schema":
        import sqlite3

        with sqlite3.connect(db) as con:
            con.execute("CREATE TABLE extra (x)")
        return
    db.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["garbage header", "truncated", "garbage pages", "foreign schema"])
def test_damaged_database_is_moved_aside_and_rebuilt(tmp_path: Path, how: str,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    texts = _fill(tmp_path)
    _damage_db(tmp_path, how)
    with caplog.at_level(logging.WARNING, logger="ragpic.cache"):
        _serves(tmp_path, texts)
        _serves(tmp_path, texts)  # the next process opens the rebuilt index quietly
    assert caplog.text.count("was damaged") == 1, caplog.text
    assert "rebuilt the index from 12 intact entry files" in caplog.text
    assert [p.name for p in (tmp_path / "damaged").iterdir()][0].startswith("index-")


@pytest.mark.parametrize("index", ["kept", "deleted"])
def test_read_only_folder_serves_reads(tmp_path: Path, index: str, caplog: pytest.LogCaptureFixture) -> None:
    src = tmp_path / "src"
    texts = _fill(src)
    bad, _, _ = make_chunk(0, tokens=64)
    f = entry_path(src, bad)
    f.write_bytes(f.read_bytes()[:-10])  # one damaged entry the read-only folder cannot delete
    texts.pop(bad)
    if index == "deleted":
        (src / "index.sqlite").unlink()
    with read_only_view(src, tmp_path) as ro, caplog.at_level(logging.WARNING, logger="ragpic.cache"):
        store = open_store(ro, fingerprint=FP, memory_bytes=0)
        assert set(store.get_many([bad, *texts])) == set(texts)  # 11 of 11 intact entries
        assert store.get_many([bad]) == {} and store.stats().corrupt == 1  # logged and counted once
        assert set(store.texts()) == set(texts)
        key, kv, text = make_chunk(99, tokens=64)
        with pytest.raises(StoreError, match=r"takes no writes: it is read-only \(mount or permissions\) "
                                             r"\(point store= at a writable folder to add chunks; reads still work\)"):
            store.put_many({key: (kv, text)}, strict=True)
        store.close()
    assert caplog.text.count(f"KV entry {bad} is unusable") == 1


def test_full_disk_serves_reads_and_says_why_it_cannot_write(tmp_path: Path) -> None:
    with tmpfs(tmp_path, "3m") as mnt:
        texts = _fill(mnt / "kv", 4)
        fill_disk(mnt)
        _serves(mnt / "kv", texts)
        store = open_store(mnt / "kv", fingerprint=FP, memory_bytes=0)
        key, kv, text = make_chunk(99, tokens=300)
        with pytest.raises(StoreError, match=r"could not be stored: .*(No space left on device|disk is full)"):
            store.put_many({key: (kv, text)}, strict=True)
        assert not store.backend.contains(key) and list((mnt / "kv" / "entries").rglob("*.tmp")) == []
        store.close()


@pytest.mark.parametrize("body", [b"{not json", b'{"format_version": "v1"}', b"[1, 2]", b"", b"\xff\xfe{}",
                                  b'{"fingerprint": 7}'])
def test_bad_manifest_is_reported_and_ignored(tmp_path: Path, body: bytes, lm, caplog: pytest.LogCaptureFixture) -> None:
    texts = _fill(tmp_path)
    (tmp_path / "manifest.json").write_bytes(body)
    with caplog.at_level(logging.WARNING, logger="ragpic.cache"):
        _serves(tmp_path, texts)
        RagPic(Config(store=str(tmp_path)), lm=lm).store.close()  # used to raise JSONDecodeError / ValueError
    assert "manifest.json is unreadable" in caplog.text and "ignoring it (entries are self-describing)" in caplog.text
    assert (tmp_path / "manifest.json").read_bytes() == body  # reported, not overwritten


def test_newer_manifest_format_is_refused(tmp_path: Path) -> None:
    _fill(tmp_path, 1)
    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": 99}))
    with pytest.raises(ConfigError, match=r"store='.*' holds KV entries of format version 99; this ragpic reads "
                                          r"up to 1: upgrade ragpic or pass another folder as store"):
        open_store(tmp_path, fingerprint=FP)
