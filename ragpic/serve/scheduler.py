"""The scheduler thread: it owns the model and interleaves links with batched decode steps.

Each turn: run a queued model call (``/v1/context_cache`` compiles); take at most one
waiting request into linking; run one piece of that link, at most ``link_piece`` recomputed
rows (with nobody running, the whole link); drop cancelled jobs; then one decode forward for
every running request (continuous batching: a request joins the batch the step after its
link and leaves it when it finishes). Admission (docs/SERVING.md, *Admission*): a request
that finds a free batch slot is admitted at once, only requests beyond the batch count
against ``max_queue`` (past it :class:`QueueFull`, HTTP 429). A cancelled job is dropped
wherever it is. :meth:`Scheduler.drain` refuses new jobs (:class:`ShuttingDown`, HTTP 503);
:meth:`Scheduler.abort` ends every job still there with that error. A request that fails
gets its error as an event and the loop goes on; a failed batched step fails its requests.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
from collections.abc import Callable

import torch

from ragpic.core.ops.linked_cache import SlabPool
from ragpic.serve.job import GenJob
from ragpic.serve.metrics import Metrics
from ragpic.serve.outcomes import QueueFull, ShuttingDown, count_link, dropped, failed, finished, wait_idle
from ragpic.serve.running import Linking, Running, begin, start, step

__all__ = ["QueueFull", "Scheduler", "ShuttingDown", "wait_idle"]

log = logging.getLogger("ragpic.serve")


class Scheduler:
    """Runs every model call of one server on one thread.

    Args:
        engine: the :class:`ragpic.RagPic` whose model and store it uses.
        max_batch: most requests decoded together (1: one at a time, the unbatched baseline).
        max_queue: most requests waiting to be linked.
        max_prompt_tokens: longest prompt accepted (tokens).
        link_piece: most rows a link recomputes between two decode steps (None: links run whole).
        metrics: where it counts what it does.
    """

    def __init__(self, engine, *, max_batch: int = 8, max_queue: int = 64, max_prompt_tokens: int | None = None,
                 link_piece: int | None = 512, metrics: Metrics | None = None):
        self.engine, self.max_batch, self.max_queue, self.link_piece = engine, max_batch, max_queue, link_piece
        self.max_prompt_tokens = max_prompt_tokens or engine.context_window
        self.metrics = metrics or Metrics()
        self.pool = SlabPool(max_idle=max_batch)  # the running requests' cache memory, reused
        self._waiting: collections.deque[GenJob] = collections.deque()
        self._calls: collections.deque[tuple[Callable[[], object], concurrent.futures.Future]] = collections.deque()
        self._running: list[Running] = []
        self._linking: Linking | None = None  # the one request being linked, piece by piece
        self._wake = threading.Condition()
        self._stop = False
        self._draining = False
        self._abort: ShuttingDown | None = None  # set by abort(): the loop fails every job with it
        self._matching = 0  # a job being matched against the store (begin), for the gauges
        self._batching = True  # off for good if the model's attention ignores batched steps
        self._thread = threading.Thread(target=self._loop, name="ragpic-scheduler", daemon=True)

    # -- from other threads ----------------------------------------------------------------
    def start(self) -> "Scheduler":
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        self._thread.join(timeout)

    def submit(self, job: GenJob) -> None:
        """Queue ``job``; raises :class:`QueueFull` when the batch is full and ``max_queue`` jobs
        wait beyond it already, :class:`ShuttingDown` after :meth:`drain`."""
        with self._wake:
            if self._draining:
                raise ShuttingDown("the server is shutting down: retry on another replica")
            if len(self._waiting) >= self.max_queue + self._free_slots():
                raise QueueFull(f"{self.gauges()['queued']} requests are waiting beyond the batch (--max-queue {self.max_queue})")
            self._waiting.append(job)
            self._wake.notify()

    def drain(self) -> None:
        """Take no new job (running and waiting ones go on)."""
        with self._wake:
            self._draining = True

    def abort(self, exc: ShuttingDown) -> None:
        """End every job still waiting, linking or decoding with ``exc`` (on the loop's next turn)."""
        with self._wake:
            self._abort = exc
            self._wake.notify()

    def _free_slots(self) -> int:
        return max(0, self.max_batch - len(self._running) - (self._linking is not None) - self._matching)

    def call(self, fn: Callable[[], object]) -> concurrent.futures.Future:
        """Run ``fn()`` on the scheduler thread between steps (anything that uses the model)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._wake:
            self._calls.append((fn, fut))
            self._wake.notify()
        return fut

    def gauges(self) -> dict[str, int]:
        """Requests by state: ``queued`` (beyond the batch: what ``max_queue`` bounds),
        ``matching`` (against the store), ``linking`` (admitted to the batch, link running or
        to start), ``decoding``, and ``active`` (matching + linking + decoding)."""
        free = self._free_slots()
        out = {"queued": max(0, len(self._waiting) - free), "matching": self._matching,
               "linking": (self._linking is not None) + min(len(self._waiting), free), "decoding": len(self._running)}
        out["active"] = out["matching"] + out["linking"] + out["decoding"]
        return out

    @property
    def idle(self) -> bool:
        return not (self._waiting or self._running or self._linking or self._matching)

    # -- the loop ----------------------------------------------------------------------------
    def _loop(self) -> None:
        with torch.inference_mode():  # link's caches are inference tensors; decode writes them
            self._turns()
        for r in self._running:  # shutting down
            self._release(r)
        if self._linking is not None:
            self._linking.link.abandon()

    def _turns(self) -> None:
        while True:
            with self._wake:
                while not (self._stop or self._abort or self._waiting or self._calls or self._running
                           or self._linking):
                    self._wake.wait()
                if self._stop:
                    break
                aborted, self._abort = self._abort, None
                gone = [j for j in self._waiting if j.cancelled or aborted]
                self._waiting = collections.deque(j for j in self._waiting if not (j.cancelled or aborted))
                call = self._calls.popleft() if self._calls else None
                free = self._linking is None and len(self._running) < self.max_batch
                job = self._waiting.popleft() if self._waiting and free else None
                self._matching = int(job is not None)
            for j in gone:
                dropped(self.metrics, j, aborted)
            try:
                if aborted:
                    self._abort_running(aborted)
                self._turn(call, job)
            except Exception:  # a bookkeeping bug must not stop the server's only model thread
                log.exception("scheduler turn failed")

    def _turn(self, call, job: GenJob | None) -> None:
        if call is not None:
            self._run_call(*call)
        if job is not None:
            self._begin(job)
        if self._linking is not None:
            self._link_piece()
        self._drop_cancelled()
        if self._running:
            self._step()

    def _run_call(self, fn: Callable[[], object], fut: concurrent.futures.Future) -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(fn())
        except BaseException as exc:  # the caller gets it; the loop goes on
            fut.set_exception(exc)

    def _begin(self, job: GenJob) -> None:
        try:
            if job.cancelled:
                dropped(self.metrics, job, None)
            else:
                self._linking = begin(self.engine, job, self.pool, self.max_prompt_tokens, self.link_piece)
        except Exception as exc:
            failed(self.metrics, job, exc, where="link")
        finally:
            self._matching = 0

    def _abort_running(self, exc: ShuttingDown) -> None:
        if self._linking is not None:
            linking, self._linking = self._linking, None
            linking.link.abandon()
            dropped(self.metrics, linking.job, exc)
        for r in list(self._running):
            self._running.remove(r)
            dropped(self.metrics, r.job, exc)
            self._release(r)

    def _link_piece(self) -> None:
        # self._linking stays set until the link ends: it holds a batch slot (admission counts it)
        linking = self._linking
        if linking.job.cancelled:
            self._linking = None
            linking.link.abandon()
            dropped(self.metrics, linking.job, None)
            return
        try:
            # One piece while others decode; with nobody decoding there is no one to wait for.
            while not linking.link.advance() and not self._running:
                pass
            if not linking.link.done:
                return
            run = start(self.engine, linking)
        except Exception as exc:
            self._linking = None
            linking.link.abandon()
            if linking.link.result is not None:  # linked, but no running request took the cache
                self.pool.release(linking.link.result.cache)
            failed(self.metrics, linking.job, exc, where="link")
            return
        count_link(self.metrics, run)
        if run.done:  # finished at its first token
            self._finish(run)
        else:
            self._running.append(run)
        self._linking = None  # after the append: the slot passes from linking to running

    def _step(self) -> None:
        runs = list(self._running)
        try:
            if not step(self.engine, runs, self._batching) and self._batching:
                log.warning("this model's attention does not honour batched decode steps: decoding one "
                            "request at a time")
                self._batching = False
        except Exception as exc:
            for r in runs:
                self._running.remove(r)
                failed(self.metrics, r.job, exc, where="decode")
                self._release(r)
            return
        self.metrics.inc("decode_steps")
        self.metrics.observe("batch", len(runs))
        for r in runs:
            if r.done:
                self._running.remove(r)
                self._finish(r)

    def _finish(self, run: Running) -> None:
        finished(self.metrics, run)
        self._release(run)

    def _drop_cancelled(self) -> None:
        for r in [r for r in self._running if r.job.cancelled]:
            self._running.remove(r)
            dropped(self.metrics, r.job, None)
            self._release(r)

    def _release(self, run: Running) -> None:
        if run.cache is not None:
            self.pool.release(run.cache)
            run.cache = None
