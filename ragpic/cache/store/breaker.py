"""A circuit breaker per direction (read / write) with a back-off that doubles.

A failed backend call opens its direction for ``base_s`` seconds, then twice that after the
next failure, up to ``max_s``; a success closes it again. While open, calls are skipped
(the store answers as a miss) instead of waiting on a server that has already failed once.
When the back-off has passed, one caller at a time gets through as a probe. An
``unreachable`` failure (timeout, refused connection) opens both directions: a server that
does not answer reads will not answer writes either.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

DIRECTIONS = ("read", "write")


@dataclass(slots=True)
class _State:
    failures: int = 0
    until: float = 0.0
    probing: bool = False


class Breaker:
    """Thread-safe; ``clock`` is injectable for tests (monotonic seconds)."""

    def __init__(self, base_s: float = 1.0, max_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        if base_s < 0 or max_s < base_s:
            raise ValueError(f"need 0 <= base_s <= max_s, got base_s={base_s}, max_s={max_s}")
        self.base_s, self.max_s, self._clock = base_s, max_s, clock
        self._states = {d: _State() for d in DIRECTIONS}
        self._lock = threading.Lock()

    def allow(self, direction: str) -> bool:
        """Whether a call may go ahead now (closed, or the single probe after a back-off)."""
        with self._lock:
            st = self._states[direction]
            if st.failures == 0:
                return True
            if st.probing or self._clock() < st.until:
                return False
            st.probing = True
            return True

    def success(self, direction: str) -> None:
        with self._lock:
            self._states[direction] = _State()

    def failure(self, direction: str, *, unreachable: bool = False) -> float:
        """Open ``direction`` (both when ``unreachable``); return the back-off in seconds."""
        with self._lock:
            backoff = 0.0
            for d in DIRECTIONS if unreachable else (direction,):
                st = self._states[d]
                st.failures += 1
                backoff = min(self.max_s, self.base_s * 2 ** (st.failures - 1)) if self.base_s else 0.0
                st.until, st.probing = self._clock() + backoff, False
            return backoff

    def open_for(self, direction: str) -> float:
        """Seconds until ``direction`` lets a probe through (0 when closed)."""
        with self._lock:
            st = self._states[direction]
            return max(0.0, st.until - self._clock()) if st.failures else 0.0
