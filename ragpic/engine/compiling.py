"""A compile as a job of pieces: the model thread runs one piece per turn, another thread stores them.

A :class:`CompileWork` is the chunks to compile (tokenized off the model thread) cut into
pieces of at most ``piece_rows`` rows: consecutive short chunks together, a longer chunk in
parts (a causal prefill continued over an appending cache: each part's rows attend to the
parts before, so the chunk's KV is that of one prefill, up to rounding). The scheduler runs
one piece per turn between decode steps (docs/SERVING.md, *The turn*) with
:meth:`CompileWork.run_piece`, which runs the model and encodes the finished chunks' entries
(quantizing is tensor work: it stays on the model thread, docs/ARCHITECTURE.md §4, *One thread
does the tensor work*); :func:`store_pieces`, on the caller's thread (a request handler's
worker thread or a matcher thread, never the event loop nor the model thread), writes each
piece's entries to the store as they come, which is only I/O. A work whose
owner is cancelled (its client left) is dropped by the scheduler: the store then holds
exactly the chunks whose pieces all finished, each whole and valid.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import queue
from collections.abc import Sequence

from ragpic.core.compile import ChunkInParts
from ragpic.core.kv import ChunkKV
from ragpic.core.compile_recipe import recipe_dummies
from ragpic.core.methods import Method
from ragpic.engine.compile_pipeline import ChunkJob, StoreWriter, compile_entries, text_jobs

if TYPE_CHECKING:
    from ragpic.engine.engine import RagPic

__all__ = ["CompileWork", "store_pieces", "tokenized"]

_ENDED = object()  # queued after the last piece (or when the work was dropped or failed)


def _pieces(lengths: list[int], piece_rows: int | None) -> list[tuple[list[int], int, int | None]]:
    """Pieces as ``(chunk indices, first row, end row)``: consecutive whole chunks (end None)
    holding <= ``piece_rows`` rows together, or rows ``[a, b)`` of one longer chunk (None: one
    chunk per piece)."""
    out: list[tuple[list[int], int, int | None]] = []
    rows = 0
    for i, n in enumerate(lengths):
        if piece_rows is not None and n > piece_rows:
            out += [([i], a, min(a + piece_rows, n)) for a in range(0, n, piece_rows)]
        elif out and out[-1][2] is None and piece_rows is not None and rows + n <= piece_rows:
            out[-1][0].append(i)
            rows += n
        else:
            out.append(([i], 0, None))
            rows = n
    return out


class CompileWork:
    """Chunks to compile in pieces.

    Args:
        todo: the chunks, in order (:func:`tokenized`).
        method: whose recipe compiles them (``plain``, ``bosN``).
        piece_rows: most rows per piece (with the recipe's dummy rows; None: one chunk per piece).
        store: the :class:`~ragpic.cache.store.ChunkStore` the chunks go to (it encodes them).
        owner: anything with a ``cancelled`` flag (a job, a handler's token): the work follows it.
    """

    def __init__(self, todo: Sequence[ChunkJob], method: Method, piece_rows: int | None, store, owner=None):
        self.todo, self.recipe, self.owner = list(todo), method.recipe, owner
        self.writer = StoreWriter(store, strict=True)
        dummies = recipe_dummies(self.recipe)
        self.lengths = [len(job.ids) + dummies for job in self.todo]
        self.pieces = _pieces(self.lengths, piece_rows)
        self.done_pieces = 0
        self.failed: BaseException | None = None
        self.results: queue.Queue = queue.Queue()
        self._cancelled = False
        self._partial: ChunkInParts | None = None  # a long chunk's cache between its parts
        if not self.pieces:  # nothing to compile: ended already
            self.end()

    @property
    def cancelled(self) -> bool:
        return self._cancelled or bool(getattr(self.owner, "cancelled", False))

    def cancel(self) -> None:
        self._cancelled = True

    @property
    def pieces_left(self) -> int:
        return len(self.pieces) - self.done_pieces

    @property
    def next_rows(self) -> int:
        """Rows the next piece forwards (0 when none is left)."""
        if self.pieces_left <= 0:
            return 0
        part, a, b = self.pieces[self.done_pieces]
        return b - a if b is not None else sum(self.lengths[i] for i in part)

    def run_piece(self, lm) -> int:
        """On the model thread: compile the next piece and encode the chunks it finished for
        the store (handed to :func:`store_pieces`); its rows."""
        rows = self.next_rows
        part, a, b = self.pieces[self.done_pieces]
        encoded = []
        try:
            if b is None:
                compile_entries(lm, [self.todo[i] for i in part], self.recipe, batch_tokens=max(rows, 1),
                                sink=lambda jobs, kvs: encoded.append(self.writer.encode(jobs, kvs)))
            elif kv := self._part(lm, part[0], a, b):
                encoded.append(self.writer.encode([self.todo[part[0]]], kv))
        except Exception as exc:
            self.end(exc)
            raise
        self.done_pieces += 1
        for one in encoded:
            self.results.put(one)
        if self.pieces_left == 0:
            self.end()
        return rows

    def _part(self, lm, i: int, a: int, b: int) -> list[ChunkKV]:
        """Rows ``[a, b)`` of chunk ``i`` (its dummy rows first); its KV once ``b`` is its end."""
        if a == 0:
            self._partial = ChunkInParts(lm, self.todo[i].ids, self.recipe, index=i)
        kv = self._partial.run(b)
        if kv is None:
            return []
        self._partial = None
        return [kv]

    def end(self, exc: BaseException | None = None) -> None:
        """No piece will follow (finished, dropped, failed with ``exc``)."""
        if exc is not None and self.failed is None:
            self.failed = exc
        self.results.put(_ENDED)


def tokenized(engine: "RagPic", todo: Sequence[tuple[str, str]]) -> list[ChunkJob]:
    """``(key, text)`` pairs as the pipeline's jobs: tokenized off the model thread."""
    return text_jobs(engine.lm.tokenizer, todo)


def store_pieces(work: CompileWork) -> dict[str, ChunkKV]:
    """Blocking, off the model thread: write each piece of ``work`` to its store as it
    finishes, until the work ends; ``key -> KV`` as a read of its entry returns it, of every
    chunk written. Raises the piece's error when one failed (the pieces before it stay stored)."""
    out: dict[str, ChunkKV] = {}
    while (encoded := work.results.get()) is not _ENDED:
        work.writer.write(encoded)  # strict: a failed write raises, the caller answers 503
        out.update(encoded.read_form)
    if work.failed is not None:
        raise work.failed
    return out
