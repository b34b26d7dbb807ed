"""RedisBackend: entry bytes in a Redis server (or a Redis Cluster) shared by several machines.

Keys, for a store key ``k`` and prefix ``p``::

    p + "kv:" + k              the entry bytes
    p + "meta:" + k            the payload length as ASCII; written *after* the payload
    p + "catalog:" + fp        hash  key -> chunk text  (see ChunkStore.texts(), catalog.py)
    p + "tidx:" + fp + ":..."  the anchors of the catalog's texts (see text.py)
    p + "counters"             hash  hits, misses, ... added by every store (ragpic store stats)
    p + "tenants:..."          ``ragpic serve``'s tenant records (ragpic.serve.tenant_redis), written
                               through :attr:`RedisBackend.client`; never an entry key, so
                               ``ragpic store check`` passes them by

On a Redis Cluster (``redis-cluster://host:port,...``) the entry keys carry a hash tag,
``p + "kv:{" + k + "}"`` and ``p + "meta:{" + k + "}"``, so both keys of one entry live in one
slot (one node): the presence check reads both in one command, and "payload before meta"
is an order on one node. Entries spread over the cluster's slots by their content key.
A transaction cannot span slots there, so the meta keys are written (after every payload)
and then the catalog rows: a crash between the two leaves entries that hints find but
prompt matching does not, until ``ragpic store check --repair`` adds their rows (tested).

An entry is stored when both its payload and its meta key exist: readers and
:meth:`contains_many` check both, so a meta key whose payload was lost (evicted, expired,
deleted) reads as absent and the chunk is compiled and written again instead of being
reported present forever. Payloads are written first; then each meta key, its catalog
row and its anchor row are written together in one ``MULTI`` transaction, so the catalog,
the text index and the entries cannot disagree (on a standalone server); :meth:`drop`
removes all three in one transaction too. Deletes remove meta first. With ``ttl_s`` both
keys expire (meta a little later than payload, which reads as a miss); the rows of an
expired entry go when a catalog read finds it gone.

Timeouts: a query waits at most ``timeout_s`` for any one socket operation (default
0.25 s) and redis-py's retries are off, so a stalled server costs one bounded wait; the
store's breaker then skips the server. Ingest writes (``patient=True``) use a second
connection pool with ``ingest_timeout_s``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ragpic.cache.backends.base import KVBackend
from ragpic.cache.backends.redis.catalog import RedisCatalog
from ragpic.cache.backends.redis.inspect import RedisInspection
from ragpic.cache.backends.redis.text import RedisTextRows
from ragpic.cache.backends.spec import cluster_nodes
from ragpic.cache.format.entry_header import read_header


class RedisBackend(RedisCatalog, RedisInspection, KVBackend):
    """Pipelined Redis store of entry bytes.

    Args:
        url: ``redis://[:password@]host:port/db`` (also ``rediss://``), or
            ``redis-cluster://[:password@]host:port,...`` for a Redis Cluster.
        prefix: namespace for every key this backend touches.
        ttl_s: optional expiry of each entry, in seconds.
        timeout_s: socket and connect timeout of query-path calls.
        ingest_timeout_s: socket timeout of ``put_many(patient=True)``.
    """

    self_cataloguing = True  # put_many writes catalog rows with the meta keys

    def __init__(self, url: str, prefix: str = "ragpic:", *, ttl_s: float | None = None, timeout_s: float = 0.25,
                 ingest_timeout_s: float = 30.0) -> None:
        self.prefix = prefix
        self.ttl_ms = None if ttl_s is None else max(1, int(ttl_s * 1000))
        self.cluster = url.lower().startswith("redis-cluster://")
        self._tag = ("{", "}") if self.cluster else ("", "")
        self._r = self._client(url, timeout_s)
        self._url, self._ingest_timeout_s = url, ingest_timeout_s
        self._slow = None
        if self.cluster:
            self._where = "cluster " + ",".join(f"{h}:{p}" for h, p in cluster_nodes(url)[0])
        else:
            kw = self._r.connection_pool.connection_kwargs
            self._where = kw.get("path") or f"{kw.get('host')}:{kw.get('port')}/{kw.get('db', 0)}"
        self._text = RedisTextRows(self._r, prefix, self.cluster)
        self._text_ready: set[str] = set()  # fingerprints whose anchor rows were checked this process

    def _client(self, url: str, timeout_s: float):
        if self.cluster:
            from redis.cluster import ClusterNode, RedisCluster

            nodes, password = cluster_nodes(url)
            # No retries: a dead node costs one bounded wait, then the store's breaker skips Redis.
            return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in nodes], password=password,
                                socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                retry=Retry(NoBackoff(), 0), cluster_error_retry_attempts=0)
        return redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                    retry=Retry(NoBackoff(), 0), retry_on_timeout=False)

    def _ingest(self):
        if self._slow is None:
            self._slow = self._client(self._url, self._ingest_timeout_s)
        return self._slow

    def is_unreachable(self, exc: BaseException) -> bool:
        """Timeouts, connection failures and a cluster that lost slots: down for reads and writes alike."""
        from redis.exceptions import ClusterDownError, RedisClusterException

        return super().is_unreachable(exc) or isinstance(
            exc, (redis.ConnectionError, redis.TimeoutError, ClusterDownError, RedisClusterException))

    def _kv(self, key: str) -> str:
        return f"{self.prefix}kv:{self._tag[0]}{key}{self._tag[1]}"

    def _meta(self, key: str) -> str:
        return f"{self.prefix}meta:{self._tag[0]}{key}{self._tag[1]}"

    def _catalog(self, fingerprint: str) -> str:
        return f"{self.prefix}catalog:{fingerprint}"

    # -- KVBackend ---------------------------------------------------------------------------
    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        pipe = self._r.pipeline(transaction=False)
        if self.cluster:  # an MGET cannot span slots: one GET per key, grouped per node by the pipeline
            for k in keys:
                pipe.get(self._meta(k))
                pipe.get(self._kv(k))
            out = pipe.execute()
            metas, payloads = out[0::2], out[1::2]
        else:
            pipe.mget([self._meta(k) for k in keys])
            pipe.mget([self._kv(k) for k in keys])
            metas, payloads = pipe.execute()
        return [p if m is not None and p is not None else None for m, p in zip(metas, payloads)]

    def put_many(self, items: Mapping[str, bytes], *, patient: bool = False) -> None:
        """Payloads, then (meta key + catalog row + anchor row) per entry in one transaction.

        Raises:
            CorruptEntry: bytes that are not an entry; redis.RedisError: the server failed.
        """
        if not items:
            return
        heads = {key: read_header(value)[0] for key, value in items.items()}
        r = self._ingest() if patient else self._r
        pipe = r.pipeline(transaction=False)
        for key, value in items.items():
            pipe.set(self._kv(key), value, px=self.ttl_ms)
        pipe.execute()  # every payload is stored before any of their meta keys
        rows: dict[str, dict[str, str]] = {}
        for key in items:
            rows.setdefault(heads[key]["fingerprint"], {})[key] = heads[key]["text"]
        pipe = r.pipeline(transaction=not self.cluster)  # a cluster has no cross-slot MULTI
        for key, value in items.items():
            pipe.set(self._meta(key), str(len(value)), px=self.ttl_ms)
        if self.cluster:  # each catalog is one hash (one slot): its rows land together, after the metas
            pipe.execute()
            pipe = r.pipeline(transaction=False)
        later: list = []
        for fp, mapping in rows.items():
            pipe.hset(self._catalog(fp), mapping=mapping)
            self._text.queue_add(pipe, fp, mapping, later)
        pipe.execute()
        self._text.run_later(later, r)

    def contains(self, key: str) -> bool:
        return self.contains_many([key])[0]

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """Whether both the meta key and the payload of each key exist, in one round trip."""
        if not keys:
            return []
        pipe = self._r.pipeline(transaction=False)
        for key in keys:
            pipe.exists(self._meta(key), self._kv(key))
        return [n == 2 for n in pipe.execute()]

    def delete(self, key: str) -> None:
        """Remove the entry (meta first); its catalog rows go on the next catalog read, or at
        once through :meth:`drop`, which knows their fingerprint."""
        self._r.delete(self._meta(key))
        self._r.delete(self._kv(key))

    def drop(self, fingerprint: str, keys: Sequence[str]) -> None:
        """Entries, catalog rows and anchor rows of ``keys`` in one transaction (standalone)."""
        if not keys:
            return
        pipe = self._r.pipeline(transaction=not self.cluster)
        later: list = []
        for key in keys:
            pipe.delete(self._meta(key))
            pipe.delete(self._kv(key))
        self._queue_remove(pipe, fingerprint, keys, later)
        pipe.execute()
        self._text.run_later(later, self._r)

    def stats(self) -> dict[str, Any]:
        return {"backend": "redis-cluster" if self.cluster else "redis", "server": self._where, "prefix": self.prefix,
                "ttl_s": None if self.ttl_ms is None else self.ttl_ms / 1000}

    @property
    def client(self):
        """The redis-py client queries use (socket timeouts = the store's budget, no retries).
        Shared, not copied: ``ragpic serve`` keeps its tenant records (``prefix + "tenants:"``)
        through it rather than opening a second connection pool."""
        return self._r

    def close(self) -> None:
        self._r.close()
        if self._slow is not None:
            self._slow.close()
