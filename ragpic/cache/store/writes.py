"""put_to_backend: a ChunkStore's write of encoded entries to its backend, and what it
catalogues when that write fails half way."""

from __future__ import annotations

from collections.abc import Mapping

from ragpic.cache.backends.base import KVBackend
from ragpic.cache.store.catalog_view import StoreCatalog
from ragpic.cache.store.guard import Guard
from ragpic.cache.store.write_errors import write_error


def put_to_backend(backend: KVBackend, guard: Guard, catalog: StoreCatalog, encoded: dict[str, bytes],
                   texts: Mapping[str, str], strict: bool) -> list[str]:
    """Store ``encoded`` (key -> entry bytes); return the keys the backend now holds.

    A query's write (not ``strict``) is skipped while the breaker is open and a failure is
    only logged and counted; ingest (``strict``) waits on a slow medium (``patient``) and a
    failure raises, after cataloguing the entries of the batch that were stored anyway.

    Raises:
        StoreError: (``strict``) naming the first chunk not stored and the cause.
    """
    if not encoded or (not strict and not guard.breaker.allow("write")):
        return []
    try:
        backend.put_many(encoded, patient=strict)
    except Exception as exc:
        stored = stored_of(backend, list(encoded))
        catalog.add({k: texts[k] for k in stored})
        if strict:
            first = next(k for k in encoded if k not in stored)
            raise write_error(texts[first], first, exc, len(stored), len(encoded)) from exc
        guard.failed("put_many", "write", exc)
        return stored
    guard.breaker.success("write")
    catalog.add({k: texts[k] for k in encoded})
    return list(encoded)


def stored_of(backend: KVBackend, keys: list[str]) -> list[str]:
    """Which ``keys`` of a failed batch the backend holds anyway (none if it cannot even say)."""
    try:
        return [k for k, hit in zip(keys, backend.contains_many(keys)) if hit]
    except Exception:
        return []
