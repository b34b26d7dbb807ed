"""open_store: a :class:`ChunkStore` from what the user passed as ``store``."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from ragpic.cache.backends.disk import DEFAULT_SIZE_LIMIT
from ragpic.cache.backends.kinds import OpenOptions, store_kind
from ragpic.cache.store.chunk_store import DEFAULT_MEMORY_BYTES, ChunkStore

log = logging.getLogger("ragpic.cache")

DEFAULT_BUDGET_S = 0.25


def open_store(spec: str | os.PathLike[str] | None, *, fingerprint: str, memory_bytes: int = DEFAULT_MEMORY_BYTES,
               size_limit_bytes: int = DEFAULT_SIZE_LIMIT, quant: str = "none", recipes: Sequence[str] = (),
               redis_ttl_s: float | None = None, budget_s: float = DEFAULT_BUDGET_S,
               stats_interval_s: float = 300.0) -> ChunkStore:
    """Open a store from a spec: ``None``/``"memory"`` (memory only), ``"redis://..."``
    (:class:`RedisBackend`), else a folder (:class:`DiskBackend`); see :mod:`ragpic.cache.backends.spec`
    for what is accepted and :mod:`ragpic.cache.backends.kinds` for how each kind opens.

    ``stats_interval_s``: see :class:`ChunkStore`. ``budget_s`` bounds how long a query waits on a stalled store: Redis socket timeouts
    and SQLite lock waits on the query path (ingest waits longer); after one failure the
    breaker skips the store altogether. A folder that cannot be created or opened
    (e.g. a file in the way) degrades to a memory-only store with a warning and
    ``errors == 1``; the engine keeps working.

    Raises:
        ConfigError: ``spec`` is empty, has an unknown URL scheme, or is not a path
            (naming ``store`` and what to pass); or the folder holds a newer format.
    """
    kind, target = store_kind(spec)
    kwargs = dict(fingerprint=fingerprint, memory_bytes=memory_bytes, quant=quant, stats_interval_s=stats_interval_s)
    if kind.open is None:
        return ChunkStore(None, **kwargs)  # type: ignore[arg-type]
    options = OpenOptions(fingerprint=fingerprint, size_limit_bytes=size_limit_bytes, recipes=recipes,
                          redis_ttl_s=redis_ttl_s, budget_s=budget_s)
    try:
        backend = kind.open(target, options)  # type: ignore[arg-type]
    except kind.unusable as exc:
        log.warning("KV store %s %s is unusable (%s: %s); caching in memory only",
                    kind.name, target, type(exc).__name__, exc)
        store = ChunkStore(None, **kwargs)  # type: ignore[arg-type]
        store._count(errors=1)
        return store
    return ChunkStore(backend, **kwargs)  # type: ignore[arg-type]
