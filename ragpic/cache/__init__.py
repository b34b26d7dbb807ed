"""Store of compiled chunk KV, in layers (docs/ARCHITECTURE.md §2): ``format`` (content keys,
the checksummed entry format, codecs) <- ``backends`` (memory, folder, Redis; each with one
catalog of chunk texts) <- ``store`` (the tiered :class:`ChunkStore`, :func:`open_store`) <-
``tools`` (``ragpic store check`` / ``stats``)."""

from ragpic.cache.format.entry import CorruptEntry, ForeignEntry
from ragpic.cache.format.expect import Expected, expected_for
from ragpic.cache.format.keys import chunk_key
from ragpic.cache.store.opening import open_store
from ragpic.cache.store import ChunkStore, StoreStats

__all__ = ["ChunkStore", "open_store", "chunk_key", "CorruptEntry", "ForeignEntry", "StoreStats", "Expected",
           "expected_for"]
