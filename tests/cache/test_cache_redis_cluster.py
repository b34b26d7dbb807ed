"""The Redis store on a real 3-node Redis Cluster on loopback (ARCHITECTURE.md §2, `cache/`).

Entries spread over the cluster's slots (both keys of one entry in one slot, by hash tag);
payload before meta still holds; an engine on the cluster gets hits, matches chunks in
prompts through the shared text index, and keeps answering (by computing) when a node dies.
"""

from __future__ import annotations

import time
import uuid

import pytest

from cache_helpers import FP, make_chunk, same_kv
from ragpic.cache import ChunkStore, open_store
from redis_server import RedisCluster

redis = pytest.importorskip("redis", reason="redis-py is not installed (pip install 'ragpic[redis]')")
pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def cluster():
    c = RedisCluster()
    yield c
    c.stop()


def _backend(url: str, prefix: str | None = None):
    from ragpic.cache.backends.redis.backend import RedisBackend

    return RedisBackend(url, prefix=prefix or f"t{uuid.uuid4().hex[:8]}:")


def _items(seeds) -> dict:
    out = {}
    for s in seeds:
        key, kv, text = make_chunk(s, tokens=16)
        out[key] = (kv, text)
    return out


def test_entries_spread_over_the_nodes_and_round_trip(cluster):
    backend = _backend(cluster.url)
    assert backend.cluster and backend.stats()["server"].startswith("cluster ")
    store = ChunkStore(backend, fingerprint=FP, memory_bytes=0)
    items = _items(range(24))
    store.put_many(items)
    again = ChunkStore(_backend(cluster.url, backend.prefix), fingerprint=FP, memory_bytes=0)  # a second client
    assert again.contains_many([*items, "nope"]) == [True] * 24 + [False]
    got = again.get_many(list(items))
    assert all(same_kv(got[k], kv) for k, (kv, _) in items.items())
    assert again.texts() == {k: t for k, (_, t) in items.items()}
    # where the keys live: every entry's two keys on one node, the entries on several nodes
    per_node = {}
    for port in cluster.ports:
        client = redis.Redis(port=port)
        per_node[port] = {k.decode() for k in client.scan_iter(match=f"{backend.prefix}*", count=1000)}
        client.close()
    nodes_of = {}
    for key in items:
        for kind in ("kv", "meta"):
            name = f"{backend.prefix}{kind}:{{{key}}}"
            nodes_of.setdefault(key, set()).update(p for p, names in per_node.items() if name in names)
    assert all(len(n) == 1 for n in nodes_of.values())  # payload and meta side by side
    assert len({next(iter(n)) for n in nodes_of.values()}) >= 2  # spread over the slots
    assert {k for _, k in backend.scan_keys()} == set(items)
    store.close(), again.close()


def test_payload_before_meta_on_the_cluster(cluster, monkeypatch):
    """A write that fails after the payloads leaves no entry (no meta); a meta whose payload is
    gone reads as absent and the entry is written again."""
    backend = _backend(cluster.url)
    store = ChunkStore(backend, fingerprint=FP, memory_bytes=0, cooldown_s=0.0)
    items = _items([100, 101])
    real_pipeline = backend._r.pipeline
    calls = []

    def failing_second_pipeline(*a, **kw):
        calls.append(1)
        if len(calls) == 2:  # the meta-key pipeline
            raise redis.ConnectionError("injected: the connection dropped after the payloads")
        return real_pipeline(*a, **kw)

    monkeypatch.setattr(backend._r, "pipeline", failing_second_pipeline)
    store.put_many(items)  # the store logs and counts the failure; nothing raises
    monkeypatch.setattr(backend._r, "pipeline", real_pipeline)
    assert store.contains_many(list(items)) == [False, False]
    assert all(backend.payload(k) is not None for k in items)  # the payloads did land, meta did not
    store.put_many(items)
    assert store.contains_many(list(items)) == [True, True]
    key = next(iter(items))
    backend.delete_payload(key)  # e.g. evicted under maxmemory
    assert backend.contains_many([key]) == [False] and backend.get_many([key]) == [None]
    store.close()


def test_store_check_on_the_cluster_finds_and_repairs_an_uncatalogued_entry(cluster):
    """What a crash between the metas and the catalog rows leaves (no cross-slot MULTI on a
    cluster): an entry hints find but matching does not; ``ragpic store check --repair`` adds it."""
    from ragpic.cache.tools.check import check_store

    backend = _backend(cluster.url)
    store = ChunkStore(backend, fingerprint=FP, memory_bytes=0)
    items = _items([200, 201, 202])
    store.put_many(items)
    lost = next(iter(items))
    backend.catalog_remove(FP, [lost])
    report = check_store(cluster.url, repair=False, prefix=backend.prefix)
    assert (report.entries, report.uncatalogued, report.corrupt, report.orphans) == (3, 1, 0, 0)
    assert check_store(cluster.url, repair=True, prefix=backend.prefix).uncatalogued == 1
    assert lost in backend.catalog(FP) and check_store(cluster.url, repair=False, prefix=backend.prefix).clean
    store.close()


def test_open_store_takes_a_cluster_url_and_refuses_a_bad_one(cluster):
    from ragpic.errors import ConfigError

    store = open_store(cluster.url, fingerprint=FP)
    assert store.backend.stats()["backend"] == "redis-cluster"
    store.close()
    for bad in ("redis-cluster://", "redis-cluster://host", "redis-cluster://h:1,h:port"):
        with pytest.raises(ConfigError, match="host:port"):
            open_store(bad, fingerprint=FP)


def test_an_engine_on_the_cluster_hits_matches_and_survives_a_dead_node(tmp_path):
    from prompts import CHUNKS
    from ragpic import Config, RagPic
    from tiny import tiny_lm

    c = RedisCluster()
    try:
        lm = tiny_lm("llama", num_hidden_layers=2)
        texts = [f"passage {i}: {CHUNKS[i % 2]}" for i in range(8)]  # 8 entries: every node holds some
        prompt = "\n\n".join(texts) + "\n\nwhat did the fox do?"
        ref = RagPic(Config(store=None, device="cpu"), lm=lm)  # the same link, from memory
        ref.compile(texts)
        want = ref.generate(prompt, chat=False, max_new_tokens=6)
        writer = RagPic(Config(store=c.url, device="cpu"), lm=lm)
        assert writer.compile(texts) == 8
        reader = RagPic(Config(store=c.url, device="cpu", memory_cache_mb=0), lm=lm)  # every read from Redis
        g = reader.generate(prompt, chat=False, max_new_tokens=6)  # no hints: matched through the index
        assert (g.chunks_loaded, g.chunks_compiled) == (8, 0) and g.token_ids == want.token_ids
        c.kill(1)
        t0 = time.monotonic()
        g = reader.generate(prompt, chat=False, hints=texts, max_new_tokens=6)
        # answered in bounded time, the same tokens: what Redis could not give was compiled
        assert g.token_ids == want.token_ids and time.monotonic() - t0 < 10, (g.chunks_loaded, g.chunks_compiled)
        assert g.chunks_compiled >= 1 and reader.store.stats().errors >= 1
        writer.store.close(), reader.store.close()
    finally:
        c.stop()
