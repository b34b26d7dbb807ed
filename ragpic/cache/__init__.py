"""Store of compiled chunk KV: content-addressed keys, a checksummed entry format, and a
memory -> disk/Redis tiered store (see :class:`ChunkStore` and :func:`open_store`)."""

from ragpic.cache.format.entry import CorruptEntry, ForeignEntry
from ragpic.cache.format.expect import Expected, expected_for
from ragpic.cache.format.keys import chunk_key
from ragpic.cache.store.opening import open_store
from ragpic.cache.store import ChunkStore, StoreStats

__all__ = ["ChunkStore", "open_store", "chunk_key", "CorruptEntry", "ForeignEntry", "StoreStats", "Expected",
           "expected_for"]
