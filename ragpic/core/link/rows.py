"""The methods that recompute a fixed set of rows: ``full``, ``naive``, ``legolink-k``.

- ``full``: every row recomputed, causally, into the linked cache (the reference; no cached
  KV is read, so its chunks may have any recipe).
- ``naive``: cached KV re-rotated to its global positions; only uncached text recomputed.
- ``legolink-k``: also recompute the first ``k`` tokens of every chunk that does not start
  at position 0 (their attention-sink rows, compiled as a sequence start, are wrong here).
- ``legolink-0``: chunks compiled behind dummy BOS tokens (recipe ``bos4``); rows as ``naive``.

Their rows are the base rule of :class:`~ragpic.core.link.plan.Linker` (``k`` = the method's
``k``, 0 for ``naive``), and they run in pieces of at most N rows
(:mod:`ragpic.core.link.pieces`): one piece is the whole link.
"""

from __future__ import annotations

from ragpic.core.link.plan import Linker

__all__ = ["Full", "Rows"]


class Rows(Linker):
    """``naive``, ``legolink-k`` and ``legolink-0``: the base rule, in pieces."""


class Full(Rows):
    """``full``: every row recomputed, causal, as one prefill (SDPA's causal kernel where the
    model allows it) or in pieces; no cached KV is loaded."""

    every_row = True
