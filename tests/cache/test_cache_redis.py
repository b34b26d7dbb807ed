"""RedisBackend against a real redis-server on loopback: round trip, damage, outage, TTL."""

from __future__ import annotations

import logging
import time
import uuid

import pytest

from cache_helpers import FP, make_chunk, same_kv
from ragpic.cache import ChunkStore, open_store
from ragpic.cache.format.entry import encode
from redis_server import RedisServer, redis_url  # noqa: F401  (fixture)

redis = pytest.importorskip("redis", reason="redis-py is not installed (pip install 'ragpic[redis]')")
pytestmark = pytest.mark.redis


def _store(url: str, **kw) -> tuple[ChunkStore, str]:
    from ragpic.cache.backends.redis.backend import RedisBackend

    prefix = f"t{uuid.uuid4().hex[:8]}:"
    backend = RedisBackend(url, prefix=prefix, ttl_s=kw.pop("ttl_s", None))
    return ChunkStore(backend, fingerprint=FP, memory_bytes=0, **kw), prefix


def _fill(store: ChunkStore, seeds, tokens: int = 64) -> dict:
    items = {}
    for s in seeds:
        key, kv, text = make_chunk(s, tokens=tokens)
        items[key] = (kv, text)
    store.put_many(items)
    return items


def test_round_trip_and_catalog_across_instances(redis_url: str) -> None:
    store, prefix = _store(redis_url)
    items = _fill(store, range(5))
    from ragpic.cache.backends.redis.backend import RedisBackend

    again = ChunkStore(RedisBackend(redis_url, prefix=prefix), fingerprint=FP, memory_bytes=0)
    assert again.texts() == {k: t for k, (_, t) in items.items()}
    assert again.contains_many([*items, "nope"]) == [True] * 5 + [False]
    got = again.get_many(list(items))
    assert all(same_kv(got[k], kv) for k, (kv, _) in items.items())
    assert again.stats().backend_hits == 5
    for s in (store, again):
        s.close()


def test_open_store_picks_redis(redis_url: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # were the URL taken for a folder path, that folder lands here
    fp = f"pick-{uuid.uuid4().hex[:8]}"  # a key no other test writes
    key, kv, text = make_chunk(3, fingerprint=fp)
    r = redis.Redis.from_url(redis_url)
    assert not list(r.scan_iter(match=f"*{key}*"))
    store = open_store(redis_url, fingerprint=fp, memory_bytes=0)  # no hot tier: reads go to the server
    store.put_many({key: (kv, text)})
    written = list(r.scan_iter(match=f"*{key}*"))
    assert written, "open_store('redis://...') stored nothing on that server (that database)"
    assert store.texts() == {key: text} and same_kv(store.get_many([key])[key], kv)
    store.close()
    r.delete(*written, *r.scan_iter(match=f"*{fp}*"))


@pytest.mark.parametrize("how", ["flip", "truncate", "foreign", "no_meta"])
def test_damaged_redis_value_is_dropped(redis_url: str, caplog: pytest.LogCaptureFixture, how: str) -> None:
    store, prefix = _store(redis_url)
    items = _fill(store, [1, 2])
    bad, good = list(items)
    r = redis.Redis.from_url(redis_url)
    payload_key = f"{prefix}kv:{bad}"
    if how == "flip":
        data = r.get(payload_key)
        r.setrange(payload_key, len(data) - 10, bytes([data[-10] ^ 0x04]))
    elif how == "truncate":
        r.set(payload_key, r.get(payload_key)[:-100])
    elif how == "foreign":
        _, kv, text = make_chunk(9, tokens=64, fingerprint="other-model")
        r.set(payload_key, encode(kv, text=text))
    else:
        r.delete(f"{prefix}meta:{bad}")  # payload without its meta key: not complete yet
    with caplog.at_level(logging.WARNING, logger="ragpic.cache"):
        got = store.get_many([bad, good])
    assert list(got) == [good] and same_kv(got[good], items[good][0])
    if how == "no_meta":
        assert store.stats().corrupt == 0 and store.stats().misses == 1
    else:
        assert store.stats().corrupt == 1 and bad in caplog.text
        assert not r.exists(payload_key) and not r.exists(f"{prefix}meta:{bad}")
        assert bad not in store.texts(refresh=True)
    r.close()
    store.close()


def test_ttl_expires_entries(redis_url: str) -> None:
    store, _ = _store(redis_url, ttl_s=0.3)
    items = _fill(store, [1])
    assert len(store.get_many(list(items))) == 1
    time.sleep(0.5)
    assert store.get_many(list(items)) == {} and store.texts(refresh=True) == {}
    store.close()


def test_stopped_redis_degrades_to_misses(caplog: pytest.LogCaptureFixture) -> None:
    server = RedisServer()
    try:
        store, _ = _store(server.url, cooldown_s=0.0)
        items = _fill(store, [1, 2])
        store.texts()
    finally:
        server.stop()
    with caplog.at_level(logging.WARNING, logger="ragpic.cache"):
        assert store.get_many(list(items)) == {}
        _fill(store, [3])  # write skipped, no exception
        assert store.contains_many(list(items)) == [False, False]
        store.texts(refresh=True)
    st = store.stats()
    assert st.errors >= 3 and st.misses == 2 and st.puts == 2
    assert "ConnectionError" in caplog.text
    store.close()
