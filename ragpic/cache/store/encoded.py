"""Encoded entries: the tensor half of a store write, kept apart from its I/O half.

:meth:`~ragpic.cache.store.ChunkStore.put_many` is :meth:`~ragpic.cache.store.ChunkStore.encode_many`
(quantize and serialise: tensor work) then :meth:`~ragpic.cache.store.ChunkStore.write` (hot
tier, backend, catalog: no tensor math). The server encodes on its model thread and writes on
the requester's thread, so that no other thread runs an OpenMP region (docs/ARCHITECTURE.md §4,
*One thread does the tensor work*).
"""

from __future__ import annotations

from dataclasses import dataclass

from ragpic.core.kv import ChunkKV

__all__ = ["Encoded"]


@dataclass(frozen=True, slots=True)
class Encoded:
    """Entries ready to write.

    Attributes:
        entries: store key -> entry bytes.
        read_form: store key -> the KV a read of that entry returns (the KV itself in exact
            storage; the decoded int8 / int4 entry otherwise).
        texts: store key -> chunk text.
    """

    entries: dict[str, bytes]
    read_form: dict[str, ChunkKV]
    texts: dict[str, str]
