"""Where a server's tenant records live: the protocol, the in-process records, and the choice
by store (docs/SERVING.md, *Tenants* and *Two replicas behind a load balancer*).

The records are three maps, whatever holds them:

- ``namespace -> id -> store key``: the context-cache ids each namespace created;
- ``store key -> references``: how many namespaces hold an id of that entry;
- ``namespace -> store keys``: the entries a prompt of that namespace may link.

:class:`~ragpic.serve.tenants.Tenants` owns the rules (ids, 404s, when an entry goes) and
calls only :class:`TenantRecords`; each medium makes its calls atomic where replicas race:
:class:`MemoryRecords` (one lock, one process: a memory-only store),
:class:`~ragpic.serve.tenant_sqlite.FolderRecords` (a SQLite file in a folder store, one
transaction a call), :class:`~ragpic.serve.tenant_redis.RedisRecords` (Lua scripts on the
store's Redis or Redis Cluster). :func:`records_for` picks the one of the server's store.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Sequence
from typing import Protocol

__all__ = ["MemoryRecords", "TenantRecords", "records_for"]

log = logging.getLogger("ragpic.serve")


class TenantRecords(Protocol):
    """The records' calls. A medium's failure raises :class:`ragpic.errors.StoreError`."""

    where: str  # where they live, for the log ("this process", "redis 127.0.0.1:6379/0"...)

    def add(self, namespace: str, pairs: Sequence[tuple[str, str]]) -> list[bool]:
        """Give ``namespace`` each ``(id, store key)`` and the right to link the key; whether
        each id is new to it (a new id adds one reference to its key; a repeat adds none)."""

    def lookup(self, namespace: str, ids: Sequence[str]) -> dict[str, str]:
        """``id -> store key`` for the ``ids`` that ``namespace`` holds (the others are left out)."""

    def remove(self, namespace: str, cid: str, key: str) -> int | None:
        """Take ``cid`` (an id of ``key``) from ``namespace``, and its right to link ``key``:
        the references to ``key`` left (0: it was the last), or None when ``namespace`` did
        not hold ``cid`` (never held, or another replica removed it first)."""

    def owns(self, namespace: str, keys: Sequence[str]) -> list[bool]:
        """Whether a prompt of ``namespace`` may link each store key."""

    def note(self, namespace: str, keys: Sequence[str]) -> None:
        """``keys`` were compiled for ``namespace`` on a miss: its later prompts link them."""

    def refs(self, key: str) -> int:
        """References to store ``key`` (0: none), for checks and tests."""

    def close(self) -> None:
        """Let go of what the records opened (not the store's own connections)."""


class MemoryRecords:
    """The records in this process's memory, one lock: lost at exit, unseen by other
    replicas (a memory-only store keeps nothing beyond the process either)."""

    where = "this process"

    def __init__(self) -> None:
        self._ids: dict[str, dict[str, str]] = collections.defaultdict(dict)
        self._refs: collections.Counter[str] = collections.Counter()
        self._own: dict[str, set[str]] = collections.defaultdict(set)
        self._lock = threading.Lock()

    def add(self, namespace: str, pairs: Sequence[tuple[str, str]]) -> list[bool]:
        out = []
        with self._lock:
            mine = self._ids[namespace]
            for cid, key in pairs:
                new = cid not in mine
                if new:
                    mine[cid] = key
                    self._refs[key] += 1
                self._own[namespace].add(key)
                out.append(new)
        return out

    def lookup(self, namespace: str, ids: Sequence[str]) -> dict[str, str]:
        with self._lock:
            mine = self._ids.get(namespace, {})
            return {i: mine[i] for i in ids if i in mine}

    def remove(self, namespace: str, cid: str, key: str) -> int | None:
        with self._lock:
            if self._ids.get(namespace, {}).get(cid) != key:
                return None
            del self._ids[namespace][cid]
            self._own[namespace].discard(key)
            self._refs[key] -= 1
            left = self._refs[key]
            if left <= 0:
                del self._refs[key]
            return max(left, 0)

    def owns(self, namespace: str, keys: Sequence[str]) -> list[bool]:
        with self._lock:
            own = self._own.get(namespace, set())
            return [k in own for k in keys]

    def note(self, namespace: str, keys: Sequence[str]) -> None:
        with self._lock:
            self._own[namespace].update(keys)

    def refs(self, key: str) -> int:
        with self._lock:
            return self._refs.get(key, 0)

    def close(self) -> None:
        pass


def records_for(backend: object | None) -> TenantRecords:
    """The records on ``backend``'s medium (a :class:`ragpic.cache.ChunkStore`'s ``backend``):
    Redis or Redis Cluster: keys beside the entries, through the store's own client; a folder:
    ``tenants.sqlite`` in it; none (memory only) or a medium that cannot hold them (a read-only
    folder): this process's memory, with a warning naming why."""
    if backend is None:
        return MemoryRecords()
    from ragpic.cache.backends.disk.backend import DiskBackend

    if isinstance(backend, DiskBackend):
        from ragpic.serve.tenant_sqlite import open_folder_records

        folder = open_folder_records(backend.path)
        return folder if folder is not None else MemoryRecords()
    try:  # redis-py is optional; a RedisBackend exists only where it is installed
        from ragpic.cache.backends.redis.backend import RedisBackend
    except ImportError:
        RedisBackend = None  # noqa: N806
    if RedisBackend is not None and isinstance(backend, RedisBackend):
        from ragpic.serve.tenant_redis import RedisRecords

        return RedisRecords(backend.client, backend.prefix, cluster=backend.cluster, where=backend.stats()["server"])
    log.warning("tenant records: a %s store cannot hold them: ids stay in this process (lost at exit, unknown "
                "to other replicas)", type(backend).__name__)
    return MemoryRecords()
