"""The few backend calls whose shape differs between backends, made uniform for ChunkStore."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence


def contains_many(backend: object, keys: Sequence[str]) -> list[bool]:
    """``backend.contains_many`` where it exists (one round trip), else one ``contains`` per key."""
    many = getattr(backend, "contains_many", None)
    return list(many(keys)) if many is not None else [backend.contains(k) for k in keys]  # type: ignore[attr-defined]


def stored_of(backend: object, keys: Sequence[str]) -> list[str]:
    """Which ``keys`` of a failed batch the backend holds anyway (none if it cannot even say)."""
    try:
        return [k for k, hit in zip(keys, contains_many(backend, keys)) if hit]
    except Exception:
        return []


def put_many(backend: object, items: Mapping[str, bytes], *, patient: bool) -> None:
    """``backend.put_many(items)``, passing ``patient`` to backends that take it (ingest
    waits on a slow server or a held lock; a query does not)."""
    put = backend.put_many  # type: ignore[attr-defined]
    if patient and "patient" in inspect.signature(put).parameters:
        put(items, patient=True)
    else:
        put(items)
