"""RedisRecords: a server's tenant records in the store's Redis or Redis Cluster, so every
replica of the store sees the same ids and a restart loses none (docs/SERVING.md, *Tenants*).

Keys, for the store's prefix ``p`` (``ragpic:``) and ``t`` the first 32 hex digits of the
namespace's SHA-256 (a namespace name is never written into a key)::

    p + "tenants:{" + t + "}:ids"     hash  id -> store key      (the namespace's ids)
    p + "tenants:{" + t + "}:own"     set   store keys it may link
    p + "tenants:refs:{" + k + "}"    string  references to store key k

None is an entry key (``kv:``, ``meta:``), so ``ragpic store check`` passes them by. The
``{...}`` hash tags put one namespace's two keys in one Redis Cluster slot, and each
reference count in its entry's slot.

Atomicity where two replicas race: on a standalone server each call is one Lua script over
the namespace's keys and the counts it changes. A cluster script cannot span slots, so a
call runs in two steps whose order keeps a count from ever being too low (which would drop an
entry another namespace still holds): ``add`` INCRs the counts first, runs the namespace's
script (HSETNX: only one racer makes an id new), then DECRs the repeats; ``remove`` runs the
namespace's script (HGET + HDEL: only one racer removes an id), then DECRs (the value DECR
returns says who removed the last reference). A replica that dies between the steps leaves a
count one too high: that entry then stays until Redis evicts it (``maxmemory``) or it expires.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import redis

from ragpic.errors import StoreError

__all__ = ["RedisRecords"]

# KEYS: ids, own, then (standalone) one count per pair; ARGV: id1, key1, id2, key2...
_ADD = """
local out = {}
for i = 1, #ARGV / 2 do
  local new = redis.call('HSETNX', KEYS[1], ARGV[2 * i - 1], ARGV[2 * i])
  redis.call('SADD', KEYS[2], ARGV[2 * i])
  if new == 1 and #KEYS > 2 then redis.call('INCR', KEYS[2 + i]) end
  out[i] = new
end
return out
"""
# KEYS: ids, own, (standalone) the count; ARGV: id, key. -1: not held; -2: held (cluster: count next)
_REMOVE = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return -1 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('SREM', KEYS[2], ARGV[2])
if #KEYS < 3 then return -2 end
local n = redis.call('DECR', KEYS[3])
if n <= 0 then redis.call('DEL', KEYS[3]) end
return n
"""
# KEYS: one count. A count that reaches 0 is deleted (no key: no reference).
_DECR = """
local n = redis.call('DECR', KEYS[1])
if n <= 0 then redis.call('DEL', KEYS[1]) end
return n
"""


class RedisRecords:
    """:class:`~ragpic.serve.tenant_records.TenantRecords` on ``client`` (the store's own
    redis-py client, :attr:`RedisBackend.client`: no second connection pool).

    Args:
        client: a ``redis.Redis`` or ``redis.cluster.RedisCluster``.
        prefix: the store's key prefix (its entries' prefix: one Redis may hold several stores).
        cluster: whether ``client`` is a Redis Cluster (two-step calls, see the module).
        where: the server, for logs.
    """

    def __init__(self, client, prefix: str, *, cluster: bool, where: str = "") -> None:
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a string, got {type(prefix).__name__}")
        self._r, self.prefix, self.cluster = client, prefix, bool(cluster)
        self.where = f"redis {where}".strip()
        self._add, self._remove, self._decr = (client.register_script(s) for s in (_ADD, _REMOVE, _DECR))

    # -- keys ------------------------------------------------------------------------------
    def _ns(self, namespace: str, what: str) -> str:
        tag = hashlib.sha256(namespace.encode("utf-8")).hexdigest()[:32]
        return f"{self.prefix}tenants:{{{tag}}}:{what}"

    def _ref(self, key: str) -> str:
        return f"{self.prefix}tenants:refs:{{{key}}}"

    def _call(self, what: str, fn, *args):
        try:
            return fn(*args)
        except redis.RedisError as exc:  # down, stalled, out of memory...: the route answers 503
            raise StoreError(f"tenant records ({what}) on {self.where}: {type(exc).__name__}: {exc}") from exc

    # -- TenantRecords ---------------------------------------------------------------------
    def add(self, namespace: str, pairs: Sequence[tuple[str, str]]) -> list[bool]:
        if not pairs:
            return []
        return self._call("add", self._add_now, namespace, list(pairs))

    def _add_now(self, namespace: str, pairs: list[tuple[str, str]]) -> list[bool]:
        keys = [self._ns(namespace, "ids"), self._ns(namespace, "own")]
        args = [x for pair in pairs for x in pair]
        if not self.cluster:
            return [bool(n) for n in self._add(keys=keys + [self._ref(k) for _, k in pairs], args=args)]
        self._each("incr", [self._ref(k) for _, k in pairs])  # counts first: never too low
        new = [bool(n) for n in self._add(keys=keys, args=args)]
        repeats = [self._ref(k) for (_, k), fresh in zip(pairs, new) if not fresh]
        for ref in repeats:
            self._decr(keys=[ref])
        return new

    def _each(self, command: str, names: list[str]) -> list:
        pipe = self._r.pipeline(transaction=False)  # one key a command: any slots
        for name in names:
            getattr(pipe, command)(name)
        return pipe.execute()

    def lookup(self, namespace: str, ids: Sequence[str]) -> dict[str, str]:
        if not ids:
            return {}
        raw = self._call("lookup", self._r.hmget, self._ns(namespace, "ids"), list(ids))
        return {i: v.decode() for i, v in zip(ids, raw) if v is not None}

    def remove(self, namespace: str, cid: str, key: str) -> int | None:
        keys = [self._ns(namespace, "ids"), self._ns(namespace, "own")]
        if not self.cluster:
            keys.append(self._ref(key))
        n = int(self._call("remove", lambda: self._remove(keys=keys, args=[cid, key])))
        if n == -1:
            return None
        if n == -2:  # a cluster: the id is gone from the namespace; now its reference
            n = int(self._call("remove", lambda: self._decr(keys=[self._ref(key)])))
        return max(n, 0)

    def owns(self, namespace: str, keys: Sequence[str]) -> list[bool]:
        if not keys:
            return []
        hits = self._call("owns", self._r.smismember, self._ns(namespace, "own"), list(keys))
        return [bool(h) for h in hits]

    def note(self, namespace: str, keys: Sequence[str]) -> None:
        if keys:
            self._call("note", self._r.sadd, self._ns(namespace, "own"), *keys)

    def refs(self, key: str) -> int:
        """References to store ``key`` (for tests and ``redis-cli``-free checks)."""
        raw = self._call("refs", self._r.get, self._ref(key))
        return int(raw) if raw is not None else 0

    def close(self) -> None:
        pass  # the client is the store's: it closes with the store
