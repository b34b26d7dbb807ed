"""Guard: every call a ChunkStore makes to its backend, behind a circuit breaker.

A failed call is logged (a warning the first time for each kind of failure, then at debug
level), counted in ``errors`` and opens the breaker (see :mod:`ragpic.cache.store.breaker`); a
call while the breaker is open is skipped. Either way the caller gets ``(False, None)``
and answers as a miss: a store failure never fails a query.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from ragpic.cache.backends.base import KVBackend
from ragpic.cache.store.breaker import Breaker
from ragpic.cache.store.write_errors import describe, is_unreachable

log = logging.getLogger("ragpic.cache")

_T = TypeVar("_T")


class Guard:
    """Runs ``backend`` calls; ``count(errors=1)`` is called for each failure."""

    def __init__(self, backend: KVBackend | None, breaker: Breaker, count: Callable[..., None]) -> None:
        self.backend, self.breaker, self._count = backend, breaker, count
        self._warned: set[tuple[str, str]] = set()

    def call(self, direction: str, fn: Callable[..., _T] | None, *args: object) -> tuple[bool, _T | None]:
        """``(True, result)``, or ``(False, None)`` if skipped (no backend, breaker open) or failed."""
        if self.backend is None or fn is None or not self.breaker.allow(direction):
            return False, None
        try:
            result = fn(*args)
        except Exception as exc:  # a cache failure must never fail the query
            self.failed(getattr(fn, "__name__", "call"), direction, exc)
            return False, None
        self.breaker.success(direction)
        return True, result

    def failed(self, what: str, direction: str, exc: BaseException) -> None:
        """Log (once per kind), count and open the breaker for a failed call."""
        self._count(errors=1)
        backoff = self.breaker.failure(direction, unreachable=is_unreachable(self.backend, exc))
        kind = (what, type(exc).__name__)
        level = logging.DEBUG if kind in self._warned else logging.WARNING
        self._warned.add(kind)
        log.log(level, "KV store %s failed (%s); treating as a miss / skipping the write, retrying in %.1f s",
                what, describe(exc), backoff)
