"""RedisBackend: entry bytes in a (standalone) Redis server shared by several machines.

Keys, for a store key ``k`` and prefix ``p``::

    p + "kv:" + k              the entry bytes
    p + "meta:" + k            the payload length as ASCII; written *after* the payload
    p + "catalog:" + fp        hash  key -> chunk text  (see ChunkStore.texts())

A reader only returns a payload whose meta key exists; both are read in one pipelined
round trip, meta first, so a meta seen implies its payload had been written. Deletes
remove meta first. With ``ttl_s`` both keys expire (meta a little later than payload,
which reads as a miss). Redis Cluster is not supported (multi-key MGET across slots).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import redis


class RedisBackend:
    """Pipelined Redis store of entry bytes.

    Args:
        url: ``redis://[:password@]host:port/db`` (also ``rediss://``, ``unix://``).
        prefix: namespace for every key this backend touches.
        ttl_s: optional expiry of each entry, in seconds.
        socket_timeout: seconds before a stalled server raises ``redis.TimeoutError``.
    """

    def __init__(self, url: str, prefix: str = "ragpic:", *, ttl_s: float | None = None,
                 socket_timeout: float = 5.0, connect_timeout: float = 2.0) -> None:
        self.prefix = prefix
        self.ttl_ms = None if ttl_s is None else max(1, int(ttl_s * 1000))
        self._r = redis.Redis.from_url(url, socket_timeout=socket_timeout,
                                       socket_connect_timeout=connect_timeout)
        kw = self._r.connection_pool.connection_kwargs
        self._where = kw.get("path") or f"{kw.get('host')}:{kw.get('port')}/{kw.get('db', 0)}"

    def _kv(self, key: str) -> str:
        return f"{self.prefix}kv:{key}"

    def _meta(self, key: str) -> str:
        return f"{self.prefix}meta:{key}"

    def _catalog(self, fingerprint: str) -> str:
        return f"{self.prefix}catalog:{fingerprint}"

    # -- KVBackend ---------------------------------------------------------------------------
    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        pipe = self._r.pipeline(transaction=False)
        pipe.mget([self._meta(k) for k in keys])
        pipe.mget([self._kv(k) for k in keys])
        metas, payloads = pipe.execute()
        return [p if m is not None and p is not None else None for m, p in zip(metas, payloads)]

    def put_many(self, items: Mapping[str, bytes]) -> None:
        if not items:
            return
        pipe = self._r.pipeline(transaction=False)
        for key, value in items.items():
            pipe.set(self._kv(key), value, px=self.ttl_ms)
        pipe.execute()  # every payload is stored before any of their meta keys
        pipe = self._r.pipeline(transaction=False)
        for key, value in items.items():
            pipe.set(self._meta(key), str(len(value)), px=self.ttl_ms)
        pipe.execute()

    def contains(self, key: str) -> bool:
        return bool(self._r.exists(self._meta(key)))

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """Meta-key presence for each key, in one round trip."""
        if not keys:
            return []
        pipe = self._r.pipeline(transaction=False)
        for key in keys:
            pipe.exists(self._meta(key))
        return [bool(n) for n in pipe.execute()]

    def delete(self, key: str) -> None:
        self._r.delete(self._meta(key))
        self._r.delete(self._kv(key))

    def stats(self) -> dict[str, Any]:
        return {"backend": "redis", "server": self._where, "prefix": self.prefix,
                "ttl_s": None if self.ttl_ms is None else self.ttl_ms / 1000}

    def close(self) -> None:
        self._r.close()

    # -- catalog -----------------------------------------------------------------------------
    def catalog(self, fingerprint: str) -> dict[str, str]:
        """``key -> text`` for this fingerprint's entries whose meta key still exists."""
        raw = self._r.hgetall(self._catalog(fingerprint))
        rows = {k.decode(): v.decode("utf-8") for k, v in raw.items()}
        keys = list(rows)
        present: set[str] = set()
        for i in range(0, len(keys), 1000):
            batch = keys[i : i + 1000]
            metas = self._r.mget([self._meta(k) for k in batch])
            present.update(k for k, m in zip(batch, metas) if m is not None)
        stale = [k for k in keys if k not in present]
        if stale:
            self.catalog_remove(fingerprint, stale)
        return {k: t for k, t in rows.items() if k in present}

    def catalog_add(self, fingerprint: str, items: Mapping[str, str]) -> None:
        if items:
            self._r.hset(self._catalog(fingerprint), mapping=dict(items))

    def catalog_remove(self, fingerprint: str, keys: Sequence[str]) -> None:
        if keys:
            self._r.hdel(self._catalog(fingerprint), *keys)
