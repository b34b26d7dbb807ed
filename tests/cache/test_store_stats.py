"""Store statistics every process adds to (docs/RESULTS.md §11), and ``ragpic store stats``.

Hits, misses, recompiles and evictions counted by ChunkStores in a folder index's (or Redis's)
shared counters, summed over processes, logged at an interval; ``ragpic store stats`` reads
them with the entry count, bytes and bytes per token, without writing anything.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
import uuid
from pathlib import Path

import pytest

from cache_helpers import FP, make_chunk
from ragpic.cache import ChunkStore
from ragpic.cache.backends import DiskBackend
from ragpic.cache.tools.report import format_report, store_report
from redis_server import RedisCluster, redis_url  # noqa: F401  (fixture)


def _items(seeds, tokens: int = 16) -> dict:
    return {k: (kv, t) for k, kv, t in (make_chunk(s, tokens=tokens) for s in seeds)}


def _folder_store(path: Path, **kw) -> ChunkStore:
    size_limit = kw.pop("size_limit_bytes", 1 << 30)
    return ChunkStore(DiskBackend(path, size_limit, fingerprint=FP), fingerprint=FP, memory_bytes=0, **kw)


def test_folder_counters_add_up_over_processes_and_the_report_reads_them(tmp_path: Path) -> None:
    path = tmp_path / "kv"
    items = _items(range(8))
    a = _folder_store(path, stats_interval_s=0)
    a.put_many(items, strict=True)  # ingest: 8 stored, no recompile
    a.get_many(list(items)[:5] + ["0" * 64])  # 5 hits, 1 miss
    a.put_many(_items(range(8, 10)))  # written by a query that missed: 2 recompiles
    a.close()
    b = _folder_store(path, stats_interval_s=0)  # another process on the same folder
    b.get_many(list(items)[:3])
    b.close()
    r = store_report(str(path))
    assert (r.counters["hits"], r.counters["misses"], r.counters["recompiles"], r.counters["puts"]) == (8, 1, 2, 10)
    assert r.hit_rate == pytest.approx(8 / 9)
    disk = DiskBackend(path)
    entries, volume = disk._db.totals()  # noqa: SLF001
    disk.close()
    assert (r.entries, r.bytes, r.fingerprints, r.sampled, r.formats) == (10, volume, {FP: 10}, 10, {"none": 10})
    assert r.bytes_per_token == pytest.approx(volume / (10 * 16))  # every entry sampled: exact
    text = format_report(r)
    assert "entries          10 (" in text and "hit rate 88.9%" in text and "recompiles       2" in text


def test_evictions_are_counted_where_they_happen(tmp_path: Path) -> None:
    one = len(next(iter(_encoded(_items([0])).values())))
    store = _folder_store(tmp_path / "kv", size_limit_bytes=3 * one + 10, stats_interval_s=0)
    store.put_many(_items(range(7)), strict=True)
    store.close()
    r = store_report(str(tmp_path / "kv"))
    assert r.entries == 3 and r.counters["evictions"] == 4


def _encoded(items: dict) -> dict:
    from ragpic.cache.format.entry import encode

    return {k: encode(kv, text=t) for k, (kv, t) in items.items()}


def test_counters_are_flushed_and_logged_at_the_interval(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = _folder_store(tmp_path / "kv", stats_interval_s=0.05)
    items = _items(range(3))
    store.put_many(items, strict=True)
    time.sleep(0.06)
    with caplog.at_level(logging.INFO, logger="ragpic.cache"):
        store.get_many(list(items))  # the next operation after the interval reports
    assert "KV store: 3 hits, 0 misses (hit rate 100%)" in caplog.text and "disk: entries 3" in caplog.text
    assert store_report(str(tmp_path / "kv")).counters["hits"] == 3  # flushed without a close
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ragpic.cache"):
        store.get_many(list(items))  # within the interval: no second line
    assert "KV store:" not in caplog.text
    store.close()
    assert store_report(str(tmp_path / "kv")).counters["hits"] == 6  # close adds the rest, once


def test_an_index_from_before_counters_gets_them_and_reads_without(tmp_path: Path) -> None:
    path = tmp_path / "kv"
    store = _folder_store(path)
    store.put_many(_items(range(2)), strict=True)
    store.close()
    with sqlite3.connect(path / "index.sqlite") as con:  # as the release before counters left it
        con.executescript("DROP TABLE counters; DROP TRIGGER entries_del_anchor; DROP TABLE anchors;")
    old = store_report(str(path))  # read-only: accepted as it is, nothing written
    assert old.entries == 2 and old.counters == {} and "predates shared counters" in old.notes[0]
    again = _folder_store(path, stats_interval_s=0)  # opened writable: the table is added, entries kept
    assert set(again.get_many(list(_items(range(2))))) == set(_items(range(2)))
    again.close()
    assert store_report(str(path)).counters["hits"] == 2


def test_stats_cli_prints_json_and_refuses_what_is_not_a_store(tmp_path: Path, capsys) -> None:
    from ragpic.cli import main

    store = _folder_store(tmp_path / "kv", stats_interval_s=0)
    store.put_many(_items(range(4), tokens=32), strict=True)
    store.close()
    def state():  # SQLite's -wal/-shm files appear for any reader of a WAL database: not a write
        return {p.name: p.read_bytes() for p in (tmp_path / "kv").rglob("*") if p.is_file() and "sqlite-" not in p.name}

    before = state()
    assert main(["store", "stats", str(tmp_path / "kv"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["entries"], out["sampled"], out["counters"]["puts"]) == (4, 4, 4)
    assert state() == before  # read-only
    assert main(["store", "stats", str(tmp_path / "nope")]) == 2
    assert "ragpic store stats: no KV store folder at" in capsys.readouterr().err
    assert not (tmp_path / "nope").exists()


@pytest.mark.redis
def test_redis_counters_and_report(redis_url: str) -> None:  # noqa: F811
    from ragpic.cache.backends.redis.backend import RedisBackend

    prefix = f"t{uuid.uuid4().hex[:8]}:"
    items = _items(range(5))
    for _ in range(2):  # two workers on one server
        store = ChunkStore(RedisBackend(redis_url, prefix=prefix), fingerprint=FP, memory_bytes=0, stats_interval_s=0)
        store.put_many(items, strict=True)
        store.get_many(list(items)[:2] + ["f" * 64])
        store.close()
    r = store_report(redis_url, prefix=prefix)
    assert (r.kind, r.entries, r.fingerprints, r.sampled) == ("redis", 5, {FP: 5}, 5)
    assert (r.counters["hits"], r.counters["misses"], r.counters["puts"]) == (4, 2, 10)
    sizes = _encoded(items)
    assert r.bytes == sum(map(len, sizes.values()))  # every entry sampled: the estimate is exact
    assert r.bytes_per_token == pytest.approx(r.bytes / (5 * 16))


@pytest.mark.redis
def test_cluster_counters_and_report() -> None:
    from ragpic.cache.backends.redis.backend import RedisBackend

    cluster = RedisCluster()
    try:
        prefix = f"t{uuid.uuid4().hex[:8]}:"
        store = ChunkStore(RedisBackend(cluster.url, prefix=prefix), fingerprint=FP, memory_bytes=0,
                           stats_interval_s=0)
        items = _items(range(6))
        store.put_many(items, strict=True)
        store.get_many(list(items))
        store.close()
        r = store_report(cluster.url, prefix=prefix)
        assert (r.kind, r.entries, r.sampled, r.counters["hits"]) == ("redis-cluster", 6, 6, 6)
        assert "server_evicted_keys" in r.counters
    finally:
        cluster.stop()
