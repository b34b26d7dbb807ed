"""Store faults (docs/RESULTS.md §6) against a real redis-server: meta without payload heals, and a
stalled (SIGSTOPped) server never makes a query wait more than the store's budget.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid

import pytest

from cache_helpers import FP, make_chunk
from ragpic import Config, RagPic
from ragpic.cache import ChunkStore
from ragpic.cache.tools.check import check_store
from ragpic.cache.format.entry import encode
from redis_server import RedisServer, redis_url  # noqa: F401  (fixture)
from store_faults import forge
from tiny import TEXT, tiny_lm

redis = pytest.importorskip("redis", reason="redis-py is not installed (pip install 'ragpic[redis]')")
pytestmark = pytest.mark.redis

BUDGET = 0.25


def _store(url: str, prefix: str | None = None, **kw) -> ChunkStore:
    from ragpic.cache.backends.redis.backend import RedisBackend

    backend = RedisBackend(url, prefix=prefix or f"t{uuid.uuid4().hex[:8]}:", timeout_s=BUDGET)
    return ChunkStore(backend, fingerprint=FP, memory_bytes=0, **kw)


def _timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def test_stalled_redis_costs_one_budget_then_the_breaker_skips_it(caplog: pytest.LogCaptureFixture) -> None:
    server = RedisServer()
    try:
        store = _store(server.url)
        items = {k: (kv, t) for k, kv, t in (make_chunk(s) for s in range(3))}
        store.put_many(items)
        keys = list(items)
        os.kill(server.proc.pid, signal.SIGSTOP)
        with caplog.at_level(logging.WARNING, logger="ragpic.cache"):
            got, first = _timed(store.get_many, keys)
            assert got == {} and first < BUDGET + 0.3  # one bounded wait, not 2 x 5 s
            backoffs = []
            for _ in range(3):
                for _ in range(5):  # while open: no wait at all, reads and writes alike
                    (_, dt), (_, dt_put) = _timed(store.get_many, keys), _timed(store.put_many, items)
                    assert dt < 0.05 and dt_put < 0.05
                backoffs.append(store.breaker.open_for("read"))
                store.breaker._states["read"].until = 0.0  # let the next call through as the probe
                (_, probe) = _timed(store.get_many, keys)
                assert probe < BUDGET + 0.3
            assert backoffs[0] < backoffs[1] < backoffs[2]  # the back-off grows (1, 2, 4 s...)
        assert "TimeoutError" in caplog.text and "retrying in" in caplog.text
        os.kill(server.proc.pid, signal.SIGCONT)
        store.breaker = type(store.breaker)(0.0, 0.0)
        assert set(store.get_many(keys)) == set(keys)  # healthy again: hits
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()


def test_queries_of_many_threads_never_wait_on_a_stalled_redis() -> None:
    lm = tiny_lm()
    server = RedisServer()
    try:
        engine = RagPic(Config(store=server.url, max_new_tokens=4), lm=lm)
        chunks = [f"passage {i}: {TEXT[i * 40:i * 40 + 160]}" for i in range(4)]
        engine.compile(chunks)
        prompts = [f"Read {c} and answer." for c in chunks]
        engine.store.clear_memory()
        _, healthy = _timed(engine.generate, prompts[0])
        os.kill(server.proc.pid, signal.SIGSTOP)
        times: list[float] = []

        def ask(p: str) -> None:
            times.append(_timed(engine.generate, p, )[1])

        threads = [threading.Thread(target=ask, args=(p,)) for p in prompts * 2]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        total = time.perf_counter() - t0
        assert len(times) == 8
        # one query pays the budget once; everyone else finds the breaker open
        assert total < 8 * healthy + BUDGET + 1.5, (total, healthy, times)
        assert max(times) < 8 * healthy + BUDGET + 1.5
        assert engine.store.stats().errors >= 1
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()


@pytest.mark.parametrize("lost", ["payload", "meta"])
def test_half_written_redis_entry_is_recompiled(redis_url: str, lost: str) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    store = _store(redis_url, prefix)
    key, kv, text = make_chunk(1)
    store.put_many({key: (kv, text)})
    r = redis.Redis.from_url(redis_url)
    r.delete(f"{prefix}{'kv' if lost == 'payload' else 'meta'}:{key}")
    assert store.contains_many([key], texts=[text]) == [False]  # not reported present forever
    assert store.texts(refresh=True) == {} and store.get_many([key]) == {}
    store.put_many({key: (kv, text)}, strict=True)  # what compile() does for a missing chunk
    assert store.contains_many([key]) == [True] and set(store.get_many([key])) == {key}
    assert store.texts(refresh=True) == {key: text}
    r.close()
    store.close()


def test_redis_store_check_reports_and_repairs(redis_url: str) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    store = _store(redis_url, prefix)
    items = {k: (kv, t) for k, kv, t in (make_chunk(s) for s in range(5))}
    store.put_many(items)
    k0, k1, k2, k3, _ = items
    r = redis.Redis.from_url(redis_url)
    r.set(f"{prefix}kv:{k0}", forge(encode(items[k0][0], text=items[k0][1]), header={"text": "relabelled"}))
    r.delete(f"{prefix}meta:{k1}")                     # payload without meta: an interrupted write
    r.delete(f"{prefix}kv:{k2}")                       # meta without payload
    r.hdel(f"{prefix}catalog:{FP}", k3)                # stored but uncatalogued
    url = f"{redis_url}"
    report = check_store(url, prefix=prefix)
    assert (report.entries, report.corrupt, report.orphans, report.uncatalogued) == (2, 1, 2, 1)
    assert report.stale_rows == 3  # k0 (corrupt), k1 and k2 (incomplete) are still catalogued
    check_store(url, prefix=prefix, repair=True)
    after = check_store(url, prefix=prefix)
    assert after.clean and after.entries == 2 and set(store.texts(refresh=True)) == {k3, list(items)[4]}
    r.close()
    store.close()
