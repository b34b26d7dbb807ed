"""StoreStats: what a :class:`ragpic.cache.ChunkStore` did since it was created or reset."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class StoreStats:
    """Counters since creation or :meth:`ChunkStore.reset_stats` (one per looked-up key)."""

    memory_hits: int = 0
    backend_hits: int = 0
    misses: int = 0
    corrupt: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    errors: int = 0
    puts: int = 0
    repaired: int = 0

    @property
    def hits(self) -> int:
        return self.memory_hits + self.backend_hits

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0
