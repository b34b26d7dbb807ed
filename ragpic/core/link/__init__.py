"""Link: turn ordered segments (cached chunks + uncached text) into a ready KV cache.

One strategy per method (:class:`Linker`, docs/ARCHITECTURE.md §4.2), parsed once from its name
by :func:`linker_for`: :mod:`.rows` (``full``, ``naive``, ``legolink-k``), :mod:`.cacheblend`
(``cacheblend-r``), :mod:`.query_guided` (``qr-r[-kK]``), :mod:`.query_probe` (``qp-r[-kK]``).
:mod:`.plan` holds the interface, the recompute mask, the checks and the cache a link starts
from; :mod:`.pieces` runs a link, whole
(:func:`link`) or in pieces (:class:`ChunkedLink`, the server), on one path.
"""

from ragpic.core.link.pieces import ChunkedLink, link, linker_for, recompute_mask
from ragpic.core.link.plan import LinkResult, Linker, check_segments, synchronize

__all__ = ["ChunkedLink", "LinkResult", "Linker", "check_segments", "link", "linker_for", "recompute_mask",
           "synchronize"]
