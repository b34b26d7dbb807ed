"""The model thread's side of a turn: run the turn the policy chose on the work it holds.

:class:`Worker` holds the request being linked, the running requests and the compiles, and
:meth:`Worker.execute` carries out one :class:`~ragpic.serve.policy.Turn` (docs/SERVING.md,
*The turn*): drop what it names, run its one piece (a link's or a compile's), step the
running requests it names. Only model steps run here. Every request leaves through
:mod:`.outcomes`, which counts it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import logging

from ragpic.engine.compiling import CompileWork
from ragpic.serve.job import GenJob
from ragpic.serve.metrics import Metrics
from ragpic.serve.outcomes import ShuttingDown, count_link, dropped, failed, finished
from ragpic.serve.policy import Turn
from ragpic.serve.running import Running, start, step

if TYPE_CHECKING:
    from ragpic.engine.engine import RagPic

__all__ = ["Worker"]

log = logging.getLogger("ragpic.serve")


class Worker:
    """The work on the model thread. ``linking``: the one request being linked (it holds a
    batch slot); ``running``: the requests decoding; ``compiles``: compiles with pieces left."""

    def __init__(self, engine: "RagPic", metrics: Metrics):
        self.engine, self.metrics = engine, metrics
        self.linking: Running | None = None
        self.running: list[Running] = []
        self.compiles: list[CompileWork] = []
        self.batching = True  # off for good if the model's attention ignores batched steps

    def execute(self, turn: Turn, items: dict[int, object], aborted: ShuttingDown | None) -> None:
        for i in turn.drop:
            self._drop(items[i], aborted)
        if turn.piece is not None:
            # counted as it runs: streams running now wait for it (the turn log, docs/SERVING.md)
            self.metrics.piece(turn.piece.kind, turn.piece.rows, bool(self.running))
            if turn.piece.kind == "link":
                self._link_piece()
            else:
                self._compile_piece(items[turn.piece.id])
        runs = [items[i] for i in turn.decode]
        if runs:
            self._step(runs)

    def _drop(self, item, aborted: ShuttingDown | None) -> None:
        if isinstance(item, CompileWork):
            self.compiles.remove(item)
            self.metrics.inc("compiles", outcome="shutdown" if aborted else "cancelled")
            item.end(aborted if aborted is not None and not item.cancelled else None)
            return
        if isinstance(item, Running):
            if item is self.linking:
                self.linking = None
            else:
                self.running.remove(item)
            item.req.release()
        dropped(self.metrics, item if isinstance(item, GenJob) else item.job, aborted)

    def _compile_piece(self, work: CompileWork) -> None:
        try:
            work.run_piece(self.engine.lm)
        except Exception:  # the requester gets it (store_pieces raises it)
            log.exception("a compile piece failed")
        if work.pieces_left == 0 or work.failed is not None:
            self.compiles.remove(work)
            self.metrics.inc("compiles", outcome="error" if work.failed is not None else "ok")

    def _link_piece(self) -> None:
        # self.linking stays set until the link ends: it holds a batch slot (admission counts it)
        run = self.linking
        try:
            if not run.req.link_piece():
                return
            start(run)
        except Exception as exc:
            self.linking = None
            run.req.release()
            failed(self.metrics, run.job, exc, where="link")
            return
        count_link(self.metrics, run)
        if run.done:  # finished at its first token
            finished(self.metrics, run)
            run.req.release()
        else:
            self.running.append(run)
        self.linking = None  # after the append: the slot passes from linking to running

    def _step(self, runs: list[Running]) -> None:
        try:
            if not step(self.engine, runs, self.batching) and self.batching:
                log.warning("this model's attention does not honour batched decode steps: decoding one "
                            "request at a time")
                self.batching = False
        except Exception as exc:
            for r in runs:
                self.running.remove(r)
                failed(self.metrics, r.job, exc, where="decode")
                r.req.release()
            return
        self.metrics.stepped()
        self.metrics.observe("batch", len(runs))
        for r in runs:
            if r.done:
                self.running.remove(r)
                finished(self.metrics, r)
                r.req.release()

    def close(self) -> None:
        """The thread is stopping: give back every cache, end every compile."""
        for r in self.running:
            r.req.release()
        if self.linking is not None:
            self.linking.req.release()
        for w in self.compiles:
            w.end(ShuttingDown("the server stopped"))
