"""Where entry bytes persist: the :class:`KVBackend` base class (:mod:`.base`) and its media,
memory (:mod:`.memory`), a folder (:mod:`.disk`) and Redis or a Redis Cluster
(:mod:`.redis`, imported lazily: redis-py is an optional dependency). What
``store=`` accepts is :mod:`.spec`; how each kind of store opens, is checked and is reported,
:mod:`.kinds` (one row per kind)."""

from __future__ import annotations

from typing import Any

from ragpic.cache.backends.base import KVBackend
from ragpic.cache.backends.disk import DiskBackend
from ragpic.cache.backends.memory import MemoryBackend

__all__ = ["KVBackend", "MemoryBackend", "DiskBackend", "RedisBackend"]


def __getattr__(name: str) -> Any:
    if name == "RedisBackend":
        from ragpic.cache.backends.redis.backend import RedisBackend

        return RedisBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
