"""A link in pieces: at most ``piece_rows`` recomputed rows per forward, one piece per call.

A server links a new request between decode steps of the running ones (``ragpic serve``).
A ``legolink-16`` link of a 2k-token prompt recomputes ~150 rows and takes a fraction of a
second, but ``full`` prefills every token: seconds, during which no running stream gets a
token. :class:`ChunkedLink` cuts the recomputed rows, in position order, into pieces that
the scheduler runs one per turn (vLLM's chunked prefill, without fusing decode rows in).

Cutting is exact in the maths: a recomputed row at position ``p`` attends to keys ``t <= p``,
all of which are in the cache before its piece runs (rows loaded from the store are written
before the first piece; recomputed rows before ``p`` ran in an earlier piece or run in this
one). In floating point a piece runs GEMMs of other shapes than one whole forward, so logits
agree to rounding (the tests bound them), not bit for bit; a link of no more than
``piece_rows`` recomputed rows is :func:`ragpic.core.link.link` itself, bit for bit.
CacheBlend's dynamic selection needs the whole prompt at once and always runs whole.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from ragpic.core.cache_fill import fill_cached_rows, new_cache
from ragpic.core.forward import recompute_rows
from ragpic.core.link import LinkResult, check_segments, link, recompute_mask, synchronize
from ragpic.core.methods import Method, parse_method
from ragpic.core.model import LoadedModel
from ragpic.core.ops.slab_pool import SlabPool
from ragpic.core.segments import Segment, concat_ids

__all__ = ["ChunkedLink"]


class ChunkedLink:
    """Link ``segments`` with ``method`` over several :meth:`advance` calls.

    Args:
        piece_rows: most recomputed rows per forward (None: the whole link in one call).
        extra_capacity, pool: as for :func:`ragpic.core.link.link`.

    Validation (:func:`ragpic.core.link.check_segments`) runs here, so a bad prompt raises
    before any model work. ``result`` is set once :meth:`advance` has returned True;
    ``result.seconds`` sums the pieces' own time (not the turns spent between them).
    """

    def __init__(self, lm: LoadedModel, segments: Sequence[Segment], method: str | Method, *,
                 extra_capacity: int = 0, pool: SlabPool | None = None, piece_rows: int | None = None):
        if piece_rows is not None and piece_rows < 1:
            raise ValueError(f"piece_rows must be >= 1 (or None for one piece), got {piece_rows}")
        self.lm, self.segments, self.method = lm, list(segments), parse_method(method)
        self.extra_capacity, self.pool = extra_capacity, pool
        self.num_tokens = check_segments(lm, self.segments, self.method, extra_capacity)
        rec = recompute_mask(self.segments, self.method)
        self._positions = rec.nonzero().squeeze(1)  # host int64, ascending
        self._ids = concat_ids(self.segments)  # host
        whole = piece_rows is None or self.method.kind in ("cacheblend", "qr") or self._positions.numel() <= piece_rows
        self.piece_rows = self._positions.numel() if whole else piece_rows
        self.pieces = -(-self._positions.numel() // self.piece_rows)
        self.done_pieces = 0
        self.result: LinkResult | None = None
        self._cache = None
        self._seconds = 0.0

    @property
    def done(self) -> bool:
        return self.result is not None

    @torch.inference_mode()
    def advance(self) -> bool:
        """Run the next piece; True once the link is complete (``result`` set)."""
        if self.result is not None:
            return True
        if self.pieces == 1:  # the plain link, bit for bit
            self.result = link(self.lm, self.segments, self.method, extra_capacity=self.extra_capacity, pool=self.pool)
            self.done_pieces = 1
            return True
        t0 = time.perf_counter()
        lm, n = self.lm, self.num_tokens
        if self._cache is None:
            self._cache = new_cache(lm, n + self.extra_capacity, self.pool)
            if self.method.kind != "full":  # full recomputes every row: nothing to load
                fill_cached_rows(lm, self._cache, self.segments)
        a = self.done_pieces * self.piece_rows
        host_pos = self._positions[a:a + self.piece_rows]
        logits = recompute_rows(lm, self._cache, self._ids, host_pos, int(host_pos[-1]) + 1)
        self.done_pieces += 1
        synchronize(lm.device)
        self._seconds += time.perf_counter() - t0
        if self.done_pieces < self.pieces:
            return False
        self._cache.length = n
        self.result = LinkResult(logits=logits, cache=self._cache, num_tokens=n,
                                 recomputed=int(self._positions.numel()), seconds=self._seconds)
        self._cache = None
        return True

    def abandon(self) -> None:
        """Give a half-built cache's memory back to the pool (a cancelled request)."""
        if self._cache is not None and self.pool is not None:
            self.pool.release(self._cache)
        self._cache = None
