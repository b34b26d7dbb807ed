"""A compile as a job of pieces: the model thread runs one piece per turn, another thread stores them.

A :class:`CompileWork` is the chunks to compile (tokenized off the model thread) grouped
into pieces of at most ``piece_rows`` rows (one chunk when a chunk alone is longer): the
scheduler runs one piece per turn between decode steps (docs/SERVING.md, *The turn*) with
:meth:`CompileWork.run_piece`, which only runs the model; :func:`store_pieces`, on the
caller's thread (a request handler's worker thread, never the event loop nor the model
thread), writes each finished piece to the store as it comes. A work whose owner is
cancelled (its client left) is dropped by the scheduler: the store then holds exactly the
pieces that finished, each chunk whole and valid.
"""

from __future__ import annotations

import itertools
import queue
from collections.abc import Sequence

from ragpic.core.compile import compile_chunks
from ragpic.core.kv import ChunkKV
from ragpic.core.methods import Method, recipe_dummies

__all__ = ["CompileWork", "store_pieces", "tokenized"]

_ENDED = object()  # queued after the last piece (or when the work was dropped or failed)
_ids = itertools.count(1)


def _pieces(lengths: list[int], piece_rows: int | None) -> list[list[int]]:
    """Consecutive chunk indices grouped so a piece holds <= ``piece_rows`` rows (a longer
    chunk is a piece of its own; None: one chunk per piece)."""
    out: list[list[int]] = []
    rows = 0
    for i, n in enumerate(lengths):
        if out and piece_rows is not None and rows + n <= piece_rows:
            out[-1].append(i)
            rows += n
        else:
            out.append([i])
            rows = n
    return out


class CompileWork:
    """Chunks to compile in pieces.

    Args:
        todo: ``(store key, text, token ids)`` per chunk, in order.
        method: whose recipe compiles them (``plain``, ``bosN``).
        piece_rows: most rows per piece (with the recipe's dummy rows).
        owner: anything with a ``cancelled`` flag (a job, a handler's token): the work follows it.
    """

    def __init__(self, todo: Sequence[tuple[str, str, list[int]]], method: Method, piece_rows: int | None,
                 owner=None):
        self.id = next(_ids)
        self.todo, self.recipe, self.owner = list(todo), method.recipe, owner
        dummies = recipe_dummies(self.recipe)
        self.lengths = [len(ids) + dummies for _, _, ids in self.todo]
        self.pieces = _pieces(self.lengths, piece_rows)
        self.done_pieces = 0
        self.failed: BaseException | None = None
        self.results: queue.Queue = queue.Queue()
        self._cancelled = False
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
        return sum(self.lengths[i] for i in self.pieces[self.done_pieces])

    def run_piece(self, lm) -> int:
        """On the model thread: compile the next piece, hand its KV over; its rows."""
        rows = self.next_rows
        part = self.pieces[self.done_pieces]
        try:
            kvs = compile_chunks(lm, [self.todo[i][2] for i in part], recipe=self.recipe, batch_tokens=max(rows, 1))
        except Exception as exc:
            self.end(exc)
            raise
        self.done_pieces += 1
        self.results.put([(self.todo[i][0], self.todo[i][1], kv) for i, kv in zip(part, kvs)])
        if self.pieces_left == 0:
            self.end()
        return rows

    def end(self, exc: BaseException | None = None) -> None:
        """No piece will follow (finished, dropped, failed with ``exc``)."""
        if exc is not None and self.failed is None:
            self.failed = exc
        self.results.put(_ENDED)


def tokenized(engine, todo: Sequence[tuple[str, str]]) -> list[tuple[str, str, list[int]]]:
    """``(key, text)`` -> ``(key, text, token ids)``: tokenized off the model thread."""
    tok = engine.lm.tokenizer
    return [(key, text, tok(text, add_special_tokens=False)["input_ids"]) for key, text in todo]


def store_pieces(store, work: CompileWork) -> dict[str, ChunkKV]:
    """Blocking, off the model thread: write each piece of ``work`` to ``store`` as it finishes,
    until the work ends; ``key -> KV`` (as compiled, on the model's device) of every chunk written. Raises the
    piece's error when one failed (the pieces before it stay stored)."""
    out: dict[str, ChunkKV] = {}
    while (item := work.results.get()) is not _ENDED:
        batch = {key: (kv.to("cpu"), text) for key, text, kv in item}
        store.put_many(batch, strict=True)  # a failed write raises: the caller answers 503
        out.update({key: kv for key, _, kv in item})
    if work.failed is not None:
        raise work.failed
    return out
