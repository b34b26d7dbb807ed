"""The tiered store the engine holds: :class:`ChunkStore` (hot tier, verification, guard,
breaker, counters, cached catalog) and :func:`open_store` (a store from a spec)."""

from ragpic.cache.store.chunk_store import DEFAULT_MEMORY_BYTES, ChunkStore
from ragpic.cache.store.opening import open_store
from ragpic.cache.store.stats import StoreStats

__all__ = ["DEFAULT_MEMORY_BYTES", "ChunkStore", "StoreStats", "open_store"]
