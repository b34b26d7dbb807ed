"""StoreStats: what a :class:`ragpic.cache.ChunkStore` did since it was created or reset;
StoreCounters: the live, thread-safe counts behind it and their share of the backend's."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(slots=True)
class StoreStats:
    """Counters since creation or :meth:`ChunkStore.reset_stats` (one per looked-up key).

    ``recompiles``: entries written by a query that missed (``put_many`` without ``strict``),
    as opposed to ingest; each one cost a compile the store was meant to save."""

    memory_hits: int = 0
    backend_hits: int = 0
    misses: int = 0
    corrupt: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    errors: int = 0
    puts: int = 0
    repaired: int = 0
    recompiles: int = 0

    def persisted(self) -> dict[str, int]:
        """The counts a store adds to its backend's shared counters (see ``ragpic store stats``)."""
        return {"hits": self.hits, "misses": self.misses, "recompiles": self.recompiles, "puts": self.puts,
                "bytes_read": self.bytes_read, "bytes_written": self.bytes_written, "corrupt": self.corrupt}

    @property
    def hits(self) -> int:
        return self.memory_hits + self.backend_hits

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class SharedCounts:
    """What part of a store's counts its backend's shared counters already hold, and when
    they were last reported: a store adds only the difference, at most every ``interval_s``."""

    def __init__(self, interval_s: float, clock=time.monotonic) -> None:
        self.interval_s, self._clock = interval_s, clock
        self._added: dict[str, int] = {}
        self._at = clock()

    def due(self) -> bool:
        """Whether a report is due now (it then counts as made)."""
        if not self.interval_s or self._clock() - self._at < self.interval_s:
            return False
        self._at = self._clock()
        return True

    def delta(self, stats: StoreStats) -> dict[str, int]:
        """Counts not yet added (all zero: nothing to add)."""
        return {k: v - self._added.get(k, 0) for k, v in stats.persisted().items()}

    def added(self, stats: StoreStats) -> None:
        self._added = stats.persisted()

    def reset(self) -> None:
        self._added = {}


class StoreCounters:
    """A store's counts (any thread may add) and the part its backend's shared counters hold."""

    def __init__(self, interval_s: float) -> None:
        self._stats = StoreStats()
        self._lock = threading.Lock()
        self._shared = SharedCounts(interval_s)
        self._flush_lock = threading.Lock()

    def count(self, **delta: int) -> None:
        with self._lock:
            for name, n in delta.items():
                setattr(self._stats, name, getattr(self._stats, name) + n)

    def snapshot(self) -> StoreStats:
        with self._lock:
            return dataclasses.replace(self._stats)

    def due(self) -> bool:
        """Whether a report to the backend is due (see :meth:`SharedCounts.due`)."""
        return self._shared.due()

    def flush(self, add: Callable[[dict[str, int]], bool]) -> None:
        """Hand what the backend does not hold yet to ``add`` (True: it was added)."""
        with self._flush_lock:  # two threads flushing at once must not add the same counts twice
            snapshot = self.snapshot()
            delta = self._shared.delta(snapshot)
            if any(delta.values()) and add(delta):
                self._shared.added(snapshot)

    def reset(self) -> None:
        """Zero the counts (flush first: the backend keeps what was counted so far)."""
        with self._lock:
            self._stats = StoreStats()
        self._shared.reset()


def summary(st: StoreStats, figures: Mapping[str, object] | None) -> str:
    """One log line: this process's counts, then the backend's own figures."""
    line = (f"KV store: {st.hits} hits, {st.misses} misses (hit rate {100 * st.hit_rate:.0f}%), "
            f"{st.recompiles} recompiled, {st.puts} stored, {st.corrupt} corrupt, {st.errors} errors since open")
    if figures:
        parts = [f"{k} {figures[k]:,}" for k in ("entries", "volume_bytes", "evictions") if k in figures]
        line += f"; {figures.get('backend', 'backend')}: " + ", ".join(parts)
    return line
