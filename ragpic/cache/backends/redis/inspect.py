"""RedisInspection: what ``ragpic store stats`` and ``ragpic store check`` read of a Redis
store beyond the query path: the shared counters and a scan of every key under the prefix.
A mixin of :class:`~ragpic.cache.backends.redis.backend.RedisBackend` (it uses its client
``_r``, ``prefix``, ``cluster``, ``_tag`` and ``_kv``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping


class RedisInspection:
    # -- shared counters (`ragpic store stats`) --
    def add_counters(self, deltas: Mapping[str, int]) -> None:
        """HINCRBY each count into one hash (one slot on a cluster), in one round trip."""
        pipe = self._r.pipeline(transaction=False)
        for name, n in deltas.items():
            if n:
                pipe.hincrby(f"{self.prefix}counters", name, int(n))
        pipe.execute()

    def counters(self) -> dict[str, int]:
        """What every process using this server counted; Redis's own evictions (``maxmemory``)
        and expiries (``ttl_s``) are the server's, server-wide."""
        out = {k.decode(): int(v) for k, v in self._r.hgetall(f"{self.prefix}counters").items()}
        if self.cluster:  # every primary's figures, summed
            per_node = self._r.info("stats", target_nodes=self._r.PRIMARIES)
            nodes = [v for v in per_node.values() if isinstance(v, dict)] or [per_node]
            info = {k: sum(int(n.get(k, 0)) for n in nodes) for k in ("evicted_keys", "expired_keys")}
        else:
            info = self._r.info("stats")
        out["server_evicted_keys"] = int(info.get("evicted_keys", 0))
        out["server_expired_keys"] = int(info.get("expired_keys", 0))
        return out

    # -- for `ragpic store check` ------------------------------------------------------------
    def scan_keys(self) -> Iterator[tuple[str, str]]:
        """``(kind, key)`` for every ``kv:`` / ``meta:`` key under the prefix (SCAN, not KEYS)."""
        for name in self._r.scan_iter(match=f"{self.prefix}*", count=1000):  # every primary, on a cluster
            rest = name.decode("utf-8", "replace")[len(self.prefix):]
            kind, _, key = rest.partition(":")
            if kind in ("kv", "meta"):
                yield kind, key.removeprefix(self._tag[0]).removesuffix(self._tag[1])

    def catalogs(self) -> dict[str, dict[str, str]]:
        """Every fingerprint's catalog hash under the prefix."""
        out = {}
        for name in self._r.scan_iter(match=f"{self.prefix}catalog:*", count=1000):
            fp = name.decode("utf-8", "replace")[len(self.prefix) + len("catalog:"):]
            out[fp] = {k.decode(): v.decode("utf-8", "replace") for k, v in self._r.hgetall(name).items()}
        return out

    def payload(self, key: str) -> bytes | None:
        return self._r.get(self._kv(key))

    def delete_payload(self, key: str) -> None:
        self._r.delete(self._kv(key))
