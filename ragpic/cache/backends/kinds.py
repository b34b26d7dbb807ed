"""Every kind of store, one row each: how it is opened, checked and reported.

:func:`ragpic.cache.backends.spec.parse_store` says which kind a ``store=`` spec is; this
table says what to do with it, and :func:`ragpic.cache.open_store`, ``ragpic store check``
(:mod:`ragpic.cache.tools.check`) and ``ragpic store stats`` (:mod:`ragpic.cache.tools.report`)
read it instead of branching on the kind. Adding a backend is its module, its scheme in
``parse_store`` and one row here.

``open`` is a function of this layer (it imports its backend lazily: redis-py is optional).
``check`` and ``report`` belong to the tools, a layer above, so a row names them
(``"module:function"``) and only the tools import them, through :meth:`StoreKind.tool`.
"""

from __future__ import annotations

import importlib
import os
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ragpic.cache.backends.base import KVBackend
from ragpic.cache.backends.spec import parse_store

__all__ = ["KINDS", "OpenOptions", "StoreKind", "store_kind"]


@dataclass(frozen=True, slots=True)
class OpenOptions:
    """What :func:`ragpic.cache.open_store` was given; each opener takes what it needs."""

    fingerprint: str
    size_limit_bytes: int
    recipes: Sequence[str] = ()
    redis_ttl_s: float | None = None
    budget_s: float = 0.25


@dataclass(frozen=True, slots=True)
class StoreKind:
    """One kind of store (a row of :data:`KINDS`).

    Attributes:
        name: the kind, as :attr:`StoreSpec.kind` says it (and as logs and messages print it).
        open: ``(target, OpenOptions) -> KVBackend``; ``None``: memory only, no backend.
        unusable: errors of ``open`` that mean the place cannot hold a store (a file in the
            way of a folder): the store then caches in memory only, with a warning.
        check: ``"module:function"``, ``(target, *, repair, prefix) -> CheckResult``;
            ``None``: nothing to check (``ragpic store check`` refuses it).
        report: ``"module:function"``, ``(target, *, prefix, sample) -> StoreReport``;
            ``None``: nothing to report (``ragpic store stats`` refuses it).
        needs: ``(import name, pip extra)`` of an optional dependency, for the command lines
            to refuse early and name the extra.
    """

    name: str
    open: Callable[[str, OpenOptions], KVBackend] | None = None
    unusable: tuple[type[BaseException], ...] = ()
    check: str | None = None
    report: str | None = None
    needs: tuple[str, str] | None = None

    def tool(self, role: str) -> Callable | None:
        """The ``check`` or ``report`` function of this kind, imported now (``None`` if it has none)."""
        ref = getattr(self, role)
        if ref is None:
            return None
        module, _, name = ref.partition(":")
        return getattr(importlib.import_module(module), name)


def _open_folder(target: str, o: OpenOptions) -> KVBackend:
    from ragpic.cache.backends.disk import DiskBackend

    return DiskBackend(target, o.size_limit_bytes, fingerprint=o.fingerprint, recipes=o.recipes, busy_s=o.budget_s)


def _open_redis(target: str, o: OpenOptions) -> KVBackend:
    from ragpic.cache.backends.redis.backend import RedisBackend

    return RedisBackend(target, ttl_s=o.redis_ttl_s, timeout_s=o.budget_s)


KINDS: dict[str, StoreKind] = {k.name: k for k in (
    StoreKind("memory"),
    StoreKind("folder", _open_folder, unusable=(OSError, sqlite3.Error), check="ragpic.cache.tools.check:check_folder",
              report="ragpic.cache.tools.report:folder_report"),
    # redis:// and rediss:// (one server) and redis-cluster:// (the backend tells them apart)
    StoreKind("redis", _open_redis, check="ragpic.cache.tools.check_redis:check_redis",
              report="ragpic.cache.tools.report:redis_report", needs=("redis", "redis")),
)}


def store_kind(spec: str | os.PathLike[str] | None) -> tuple[StoreKind, str | None]:
    """``(its row, its target)`` for a store spec (checked by ``parse_store``, which raises
    :class:`ragpic.errors.ConfigError` for one that is not a store)."""
    parsed = parse_store(spec)
    return KINDS[parsed.kind], parsed.target
