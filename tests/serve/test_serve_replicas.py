"""Replicas that agree on tenants (docs/SERVING.md, *Tenants*, *Two replicas*): the tenant
records on raw calls (memory, a folder's SQLite file, Redis, Redis Cluster), two handles on one
medium standing for two replicas, racing; then two real ``ragpic serve`` processes on one
``redis-server``, restarted, serving two namespaces' context-cache ids."""

from __future__ import annotations

import itertools
import threading
import uuid

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ragpic.cache.backends.disk.backend import DiskBackend
from ragpic.cache.backends.redis.backend import RedisBackend
from ragpic.errors import StoreError
from ragpic.serve.bodies import BadRequest
from ragpic.serve.tenant_records import MemoryRecords, records_for
from ragpic.serve.tenant_redis import RedisRecords
from ragpic.serve.tenant_sqlite import FolderRecords
from ragpic.serve.tenants import Tenants
from redis_server import RedisCluster, redis_server  # noqa: F401 - a fixture
from serve_helpers import Server, body, free_port, sentences, tiny_home

KEY_A, KEY_B = "key-a-0123456789abcdef", "key-b-0123456789abcdef"
NEVER = "cc-" + "0" * 48  # an id nobody created


@pytest.fixture(scope="module")
def cluster():
    c = RedisCluster()
    yield c
    c.stop()


@pytest.fixture(params=["memory", "folder", "redis", "redis-cluster"])
def two(request, tmp_path):
    """Two handles on one medium (two replicas; memory: one process, so one handle twice)."""
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    if request.param == "memory":
        r = MemoryRecords()
        yield r, r
        return
    if request.param == "folder":
        handles = [FolderRecords(tmp_path / "tenants.sqlite") for _ in range(2)]
    elif request.param == "redis":
        url = request.getfixturevalue("redis_server").url
        handles = [RedisRecords(redis.Redis.from_url(url), prefix, cluster=False) for _ in range(2)]
    else:  # through records_for, as the server makes them: the store's own client
        backends = [RedisBackend(request.getfixturevalue("cluster").url, prefix=prefix, timeout_s=2.0)
                    for _ in range(2)]
        handles = [records_for(b) for b in backends]
        assert all(isinstance(h, RedisRecords) and h.cluster for h in handles)
    yield tuple(handles)
    for h in handles:
        h.close()


def test_records_keep_ids_references_and_rights(two):
    r1, r2 = two
    assert r1.add("A", [("a1", "k1"), ("a2", "k2"), ("a1", "k1")]) == [True, True, False]
    assert r2.add("A", [("a1", "k1")]) == [False]  # the other replica sees it: no second reference
    assert r2.add("B", [("b1", "k1")]) == [True]
    assert (r1.refs("k1"), r2.refs("k2"), r1.refs("k9")) == (2, 1, 0)
    assert r2.lookup("A", ["a1", "a2", "b1", "nope"]) == {"a1": "k1", "a2": "k2"}
    assert r1.lookup("B", ["a1", "a2"]) == {}
    assert r2.owns("A", ["k1", "k2", "k3"]) == [True, True, False]
    r1.note("B", ["k3"])
    assert r2.owns("B", ["k3", "k2"]) == [True, False]
    assert r2.remove("B", "a1", "k1") is None  # not B's
    assert r2.remove("A", "a1", "k2") is None  # not that id's key
    assert r2.remove("A", "a1", "k1") == 1  # B still holds k1
    assert r1.remove("A", "a1", "k1") is None  # already gone
    assert r1.lookup("A", ["a1"]) == {} and r1.owns("A", ["k1"]) == [False]
    assert r1.remove("B", "b1", "k1") == 0 and r2.refs("k1") == 0  # the last reference
    assert r1.add("A", []) == [] and r1.lookup("A", []) == {} and r1.owns("A", []) == []


def test_racing_replicas_count_every_namespace_once_and_remove_an_id_once(two):
    handles = itertools.cycle(two)
    namespaces = [f"ns{i}" for i in range(8)]
    jobs = [(next(handles), ns) for ns in namespaces for _ in range(2)]  # each namespace adds twice, at once
    gate = threading.Barrier(len(jobs))
    new: list[bool] = []

    def add(h, ns):
        gate.wait()
        new.extend(h.add(ns, [(f"id-{ns}", "shared")]))

    threads = [threading.Thread(target=add, args=job) for job in jobs]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sum(new) == len(namespaces) and two[0].refs("shared") == len(namespaces)
    gate2, left = threading.Barrier(2), []

    def remove(h):
        gate2.wait()
        left.append(h.remove("ns0", "id-ns0", "shared"))

    threads = [threading.Thread(target=remove, args=(h,)) for h in two]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sorted(left, key=str) == [len(namespaces) - 1, None] and two[1].refs("shared") == len(namespaces) - 1


def test_two_tenants_objects_on_one_medium_agree(redis_server):
    """The rules (ids, 404 without a leak, the last reference) over shared records."""
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    keys = {KEY_A: "A", KEY_B: "B"}
    t1, t2 = (Tenants(keys, RedisRecords(redis.Redis.from_url(redis_server.url), prefix, cluster=False))
              for _ in range(2))
    [(cid, new)] = t1.add("A", ["k1"], [False])
    assert new and t2.add("A", ["k1"], [True]) == [(cid, False)]
    assert t2.resolve("A", [cid], "id") == {cid: "k1"}
    assert t2.owns("A", "k1") is True and t2.owns("B", "k1") is False  # what a prompt may link

    def refusal(ns, i):
        with pytest.raises(BadRequest) as e:
            t2.resolve(ns, [i], "cache_ids")
        return e.value.status, e.value.code, e.value.param, str(e.value).replace(i, "ID")

    assert refusal("B", cid) == refusal("B", NEVER) == refusal("A", NEVER)
    [(bid, _)] = t2.add("B", ["k1"], [True])
    assert bid != cid and t1.remove("A", cid) is None  # B still holds k1
    assert t1.remove("B", bid) == "k1"  # the last: the caller deletes the entry


def test_records_for_picks_the_store_medium(tmp_path, redis_server, caplog):
    assert isinstance(records_for(None), MemoryRecords)
    folder = records_for(DiskBackend(tmp_path / "kv"))
    assert isinstance(folder, FolderRecords) and folder.path == tmp_path / "kv" / "tenants.sqlite"
    folder.close()
    backend = RedisBackend(redis_server.url, prefix="picks:")
    rec = records_for(backend)
    assert isinstance(rec, RedisRecords) and rec._r is backend.client and rec.prefix == "picks:"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tenants.sqlite").write_bytes(b"not sqlite at all" * 10)
    assert isinstance(records_for(DiskBackend(tmp_path / "bad")), MemoryRecords)
    assert "cannot keep them in" in caplog.text and "bad header" in caplog.text


def test_unreachable_records_fail_as_the_store_and_never_grant_a_link():
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.2, socket_timeout=0.2,
                         retry=Retry(NoBackoff(), 0))  # as the store's client: no retries
    dead = RedisRecords(client, "x:", cluster=False)
    with pytest.raises(StoreError, match=r"tenant records \(add\)"):
        dead.add("A", [("a1", "k1")])
    tenants = Tenants({KEY_A: "A", KEY_B: "B"}, dead)
    assert tenants.owns("A", "k1") is False  # a miss, compiled again
    tenants.note("A", ["k1"])  # logged, not raised: the answer stands
    with pytest.raises(TypeError, match="prefix"):
        RedisRecords(redis.Redis(), None, cluster=False)


# -- two real replicas -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def home(tmp_path_factory):
    h = tiny_home(tmp_path_factory, "serve-replicas")
    (h / "keys.txt").write_text(f"A {KEY_A}\nB {KEY_B}\n")
    return h


def _replicas(home, url: str, n: int = 2) -> list[Server]:
    """``n`` ``ragpic serve`` on ``url``, started at once (each load is single-threaded)."""
    out: list = [None] * n

    def start(i):
        out[i] = Server("--model", str(home / "model"), "--model-id", "tiny", "--store", url,
                        "--api-keys", str(home / "keys.txt"), home=home)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(n)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    if not all(out):
        _stop(out)
        pytest.fail("a replica did not start (its error is printed above)")
    return out


def _stop(servers: list[Server]) -> None:
    """SIGTERM to all at once (each drains, then flushes its store counts as it exits), then wait
    for each: a minute, since a drain on a loaded machine can take longer than the helper's
    default, and a replica killed before it exits has flushed nothing (named if so)."""
    live = [s for s in servers if s is not None]
    for s in live:
        if s.proc.poll() is None:
            s.proc.terminate()
    stuck = [s.port for s in live if not s.stop(60.0, signalled=True)]
    assert not stuck, f"replicas on ports {stuck} did not exit within 60 s of SIGTERM"


def _clean(servers: list[Server]) -> None:
    for s in servers:
        assert "Traceback" not in s.output(), s.output()[-2000:]


def test_two_replicas_on_redis_agree_on_tenants_across_restarts(home, redis_server):
    text = sentences()[0]
    r = redis.Redis.from_url(redis_server.url)
    servers = _replicas(home, redis_server.url)
    auth = lambda key: {"Authorization": f"Bearer {key}"}  # noqa: E731
    entries = lambda: len(list(r.scan_iter("ragpic:meta:*")))  # noqa: E731

    def clients(s):
        return s.client(headers=auth(KEY_A)), s.client(headers=auth(KEY_B))

    def err(resp, cid):
        assert resp.status_code == 404, resp.text
        e = resp.json()["error"]
        return {**e, "message": e["message"].replace(cid, "ID")}

    def same_as_never(b, cid):  # B: the very answers of an id nobody made
        assert err(b.get(f"/v1/context_cache/{cid}"), cid) == err(b.get(f"/v1/context_cache/{NEVER}"), NEVER)
        assert err(b.delete(f"/v1/context_cache/{cid}"), cid) == err(b.delete(f"/v1/context_cache/{NEVER}"), NEVER)
        assert err(b.post("/v1/chat/completions", json=body(cache_ids=[cid])), cid) == \
            err(b.post("/v1/chat/completions", json=body(cache_ids=[NEVER])), NEVER)

    try:
        (a1, b1), (a2, b2) = clients(servers[0]), clients(servers[1])
        made = a1.post("/v1/context_cache", json={"texts": [text]}).json()["data"][0]
        aid = made["id"]
        assert made["compiled"] is True
        assert a2.get(f"/v1/context_cache/{aid}").json()["text"] == text  # created on 1, read on 2
        used = a2.post("/v1/chat/completions", json=body(cache_ids=[aid], messages=[
            {"role": "user", "content": f"{text}\n\nq: why?"}]))
        assert used.status_code == 200 and used.json()["ragpic"]["chunks_loaded"] == 1, used.text[:300]
        for b in (b1, b2):
            same_as_never(b, aid)
        bmade = b2.post("/v1/context_cache", json={"texts": [text]}).json()["data"][0]
        bid = bmade["id"]
        assert bid != aid and bmade["compiled"] is True  # new in B's namespace: says nothing of A's
        stored = entries()
        assert a2.delete(f"/v1/context_cache/{aid}").json()["deleted"] is True  # A's, through replica 2
        assert a1.get(f"/v1/context_cache/{aid}").status_code == 404  # gone for both replicas
        assert a2.get(f"/v1/context_cache/{aid}").status_code == 404
        assert b1.get(f"/v1/context_cache/{bid}").json()["text"] == text  # B's reference keeps the entry
        assert entries() == stored
        again = a1.post("/v1/context_cache", json={"texts": [text]}).json()["data"][0]
        assert again["id"] == aid and again["compiled"] is True  # new to A again (the KV was kept)
        [c.close() for c in (a1, b1, a2, b2)]
        _stop(servers)
        _clean(servers)
        # the replicas' store counts reached the store's shared counters (ragpic store stats); the
        # flush at shutdown is one Redis call under the store's query budget (0.25 s), skipped
        # when a call timed out on a loaded machine (logged, and the breaker then skips the
        # store for a while): statistics never hold up a shutdown
        counters = {k.decode(): int(v) for k, v in r.hgetall("ragpic:counters").items()}
        skipped = any("KV store " in s.output() and " failed (" in s.output() for s in servers)
        assert skipped or (counters.get("puts", 0) >= 1 and counters.get("hits", 0) >= 1), \
            (counters, [s.output()[-1500:] for s in servers])

        servers = _replicas(home, redis_server.url, n=1)  # every process restarted: none kept a record
        a1, b1 = clients(servers[0])
        assert a1.get(f"/v1/context_cache/{aid}").json()["text"] == text
        assert b1.get(f"/v1/context_cache/{bid}").json()["text"] == text
        same_as_never(b1, aid)
        assert b1.delete(f"/v1/context_cache/{bid}").json()["deleted"] is True
        assert entries() == stored and a1.get(f"/v1/context_cache/{aid}").status_code == 200  # A's keeps it
        assert a1.delete(f"/v1/context_cache/{aid}").json()["deleted"] is True  # the last reference
        assert entries() == stored - 1 and not list(r.scan_iter("ragpic:tenants:refs:*"))
        [c.close() for c in (a1, b1)]
        _stop(servers)
        _clean(servers)
    finally:
        _stop(servers)
        r.close()
