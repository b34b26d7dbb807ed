"""Run a link: in pieces of at most ``piece_rows`` recomputed rows, one piece per call.

:func:`link` runs the pieces to the end in one call (the engine); a server links a new request
between decode steps of the running ones (``ragpic serve``) with :class:`ChunkedLink`, one
piece per turn: a ``legolink-16`` link of a 2k-token prompt recomputes ~150 rows, but ``full``
prefills every token, seconds during which no running stream would get a token (vLLM's
chunked prefill, without fusing decode rows in). Both are one path, so a link of no more than
``piece_rows`` recomputed rows is :func:`link` itself, bit for bit.

Cutting is exact in the maths: a recomputed row at position ``p`` attends to keys ``t <= p``,
all of which are in the cache before its piece runs (rows loaded from the store are written
before the first piece; recomputed rows before ``p`` ran in an earlier piece or run in this
one). In floating point a piece runs GEMMs of other shapes than one whole forward, so logits
agree to rounding (the tests bound them), not bit for bit. Methods that choose their rows
while they run (CacheBlend, query-guided) always run whole.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from ragpic.core.runner import recompute_rows
from ragpic.core.link.cacheblend import CacheBlend
from ragpic.core.link.plan import LinkResult, Linker, check_segments, fill_cached_rows, new_cache, synchronize
from ragpic.core.link.query_guided import QueryGuided
from ragpic.core.link.query_probe import QueryProbe
from ragpic.core.link.rows import Full, Rows
from ragpic.core.methods import Method, parse_method
from ragpic.core.model import LoadedModel
from ragpic.core.ops.linked_cache import SlabPool
from ragpic.core.segments import Segment, concat_ids
from ragpic.errors import LinkError

__all__ = ["ChunkedLink", "link", "linker_for", "recompute_mask"]

_FAMILIES: dict[str, type[Linker]] = {"full": Full, "naive": Rows, "legolink": Rows, "cacheblend": CacheBlend,
                                      "qr": QueryGuided, "qp": QueryProbe}


def linker_for(method: str | Method | Linker) -> Linker:
    """The strategy of a method name (parsed once; a :class:`Linker` is returned as is)."""
    if isinstance(method, Linker):
        return method
    method = parse_method(method, experimental=True)  # the core links any recipe; the public names are checked above
    if method.kind == "auto":  # a choice the engine makes from its model's calibration
        raise LinkError("method 'auto' picks a recipe from the model's calibration: link through an "
                        "Engine (it resolves 'auto'), or pass a concrete method such as legolink-16")
    return _FAMILIES[method.kind](method)


def recompute_mask(segments: Sequence[Segment], method: str | Method | Linker) -> torch.Tensor:
    """``(N,)`` bool: which prompt tokens ``method`` recomputes (qr: its first pass; cacheblend:
    the rows it always recomputes)."""
    return linker_for(method).recompute(segments)


class ChunkedLink:
    """Link ``segments`` with ``method`` over several :meth:`advance` calls.

    Args:
        piece_rows: most recomputed rows per forward (None: the whole link in one call).
        extra_capacity: rows to reserve after the prompt for decoding.
        pool: take the cache's memory from this pool (hand it back with ``pool.release``).

    Validation (:func:`~ragpic.core.link.plan.check_segments`) runs here, so a bad prompt raises
    before any model work. ``result`` is set once :meth:`advance` has returned True;
    ``result.seconds`` sums the pieces' own time (not the turns spent between them).
    """

    def __init__(self, lm: LoadedModel, segments: Sequence[Segment], method: str | Method | Linker, *,
                 extra_capacity: int = 0, pool: SlabPool | None = None, piece_rows: int | None = None):
        if piece_rows is not None and piece_rows < 1:
            raise ValueError(f"piece_rows must be >= 1 (or None for one piece), got {piece_rows}")
        self.lm, self.segments, self.linker = lm, list(segments), linker_for(method)
        self.method = self.linker.method
        self.extra_capacity, self.pool = extra_capacity, pool
        self.num_tokens = check_segments(lm, self.segments, self.linker, extra_capacity)
        self._rec = self.linker.recompute(self.segments)
        self._positions = self._rec.nonzero().squeeze(1)  # host int64, ascending
        self._ids = concat_ids(self.segments)  # host: link moves only what a kernel reads
        count = self._positions.numel()
        whole = piece_rows is None or not self.linker.pieces_ok or count <= piece_rows
        self.piece_rows = count if whole else piece_rows
        self.pieces = -(-count // self.piece_rows)
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
        lm, n = self.lm, self.num_tokens
        if self._cache is None:
            synchronize(lm.device)  # the link's time starts with the device idle
        t0 = time.perf_counter()
        if self._cache is None:
            self._cache = new_cache(lm, n + self.extra_capacity, self.pool)
            if not self.linker.every_row:  # full recomputes every row: nothing to load
                fill_cached_rows(lm, self._cache, self.segments)
        if self.linker.pieces_ok:
            a = self.done_pieces * self.piece_rows
            host_pos = self._positions[a:a + self.piece_rows]
            causal = self.linker.every_row and a == 0  # full's first piece: rows 0..R-1, nothing before
            logits = recompute_rows(lm, self._cache, self._ids, host_pos, int(host_pos[-1]) + 1, causal=causal)
            forwarded = self._positions.numel()
        else:
            logits, self._rec, forwarded = self.linker.run_whole(lm, self.segments, self._ids, self._rec, self._cache)
        self.done_pieces += 1
        synchronize(lm.device)
        self._seconds += time.perf_counter() - t0
        if self.done_pieces < self.pieces:
            return False
        self._cache.length = n
        self.result = LinkResult(logits=logits, cache=self._cache, num_tokens=n, recomputed=int(forwarded),
                                 seconds=self._seconds, rows=self._rec)
        self._cache = None
        return True

    def abandon(self) -> None:
        """Give a half-built cache's memory back to the pool (a cancelled request)."""
        if self._cache is not None and self.pool is not None:
            self.pool.release(self._cache)
        self._cache = None


def link(lm: LoadedModel, segments: Sequence[Segment], method: str | Method | Linker = "legolink-16",
         *, extra_capacity: int = 0, pool: SlabPool | None = None) -> LinkResult:
    """Build the prompt's KV with ``method`` and return the last token's logits: a
    :class:`ChunkedLink` of one piece, run to the end.

    Args:
        segments: the prompt in order; chunk segments carry compiled KV from this model.
        extra_capacity: rows to reserve after the prompt for decoding.
        pool: take the cache's memory from this pool (hand it back with ``pool.release``).
    Raises:
        LinkError: empty prompt, KV of another model, or wrong compile recipe;
            :class:`ContextOverflowError` (a ``LinkError``) when it does not fit.
    """
    job = ChunkedLink(lm, segments, method, extra_capacity=extra_capacity, pool=pool)
    while not job.advance():
        pass
    return job.result
