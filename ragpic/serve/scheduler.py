"""The scheduler thread: it owns the model and executes the turns the policy returns.

Each turn (docs/SERVING.md, *The turn*) is decided by :func:`ragpic.serve.policy.schedule` from
a snapshot of the waiting, linking, compiling and running work: drop what was cancelled, admit
at most one ready request into linking, run one piece (a link's or a compile's, at most
``link_piece`` rows), then one decode forward for every running request (continuous batching).
Nothing else runs on this thread: prompt matching and store reads run on the matcher threads
(:meth:`Scheduler.submit` hands a job to them; a job is admitted once matched), compiles are
stored from their requester's thread (:mod:`.compiling`). Admission (docs/SERVING.md,
*Admission*): only requests beyond the batch count against ``max_queue`` (past it
:class:`QueueFull`, HTTP 429); a request's KV rows count against ``max_kv_rows``.
:meth:`Scheduler.drain` refuses new work (:class:`ShuttingDown`, HTTP 503); :meth:`Scheduler.abort`
ends everything still there with that error. A failure ends its own request; the loop goes on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import collections
import concurrent.futures
import logging
import threading

import torch

from ragpic.errors import BadRequest
from ragpic.engine.compiling import CompileWork, store_pieces, tokenized
from ragpic.serve.job import GenJob
from ragpic.serve.metrics import Metrics
from ragpic.serve.outcomes import QueueFull, ShuttingDown, failed, wait_idle
from ragpic.serve.policy import Decoding, Limits, Request, State, Work, postprocess, schedule
from ragpic.serve.running import begin
from ragpic.serve.worker import Worker

if TYPE_CHECKING:
    from ragpic.engine.engine import RagPic

__all__ = ["QueueFull", "Scheduler", "ShuttingDown", "wait_idle"]

log = logging.getLogger("ragpic.serve")
MATCHERS = 4  # threads matching prompts against the store (store reads may wait on a network)


class Scheduler:
    """Runs every model step of one server on one thread.

    Args:
        engine: the :class:`ragpic.RagPic` whose model and store it uses.
        max_batch: most requests linking or decoding together (1: one at a time).
        max_queue: most requests waiting beyond the batch.
        max_prompt_tokens: longest prompt accepted (tokens; default the model's window).
        link_piece: most rows one piece (of a link or a compile) forwards (None: links run whole,
            compiles one chunk per piece).
        max_kv_rows: KV rows (prompt + max new tokens per request) the linking and running
            requests may hold together (default ``max_batch`` x the model's window: only the
            count binds).
        metrics: where it counts what it does.
    """

    def __init__(self, engine: "RagPic", *, max_batch: int = 8, max_queue: int = 64, max_prompt_tokens: int | None = None,
                 link_piece: int | None = 512, max_kv_rows: int | None = None, metrics: Metrics | None = None):
        self.engine, self.max_batch, self.max_queue, self.link_piece = engine, max_batch, max_queue, link_piece
        self.max_prompt_tokens = max_prompt_tokens or engine.context_window
        self.max_kv_rows = max_kv_rows or max_batch * engine.context_window
        self.metrics = metrics or Metrics()
        self.pool = engine.cache_pool(max_idle=max_batch)  # the running requests' cache memory, reused
        self._waiting: collections.deque[GenJob] = collections.deque()  # being matched, then ready (job.plan)
        self.worker = Worker(engine, self.metrics)  # what the model thread holds and runs
        self._wake = threading.Condition()
        self._stop = self._draining = False
        self._abort: ShuttingDown | None = None  # set by abort(): the next turn drops everything with it
        self._last_piece: str | None = None  # the policy's carry (which kind of piece ran last)
        self._matcher = concurrent.futures.ThreadPoolExecutor(MATCHERS, thread_name_prefix="ragpic-match")
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
        self._matcher.shutdown(wait=False, cancel_futures=True)

    def submit(self, job: GenJob) -> None:
        """Queue ``job`` and start matching it (off this and the model thread); raises
        :class:`QueueFull` when the batch is full and ``max_queue`` jobs wait beyond it already,
        :class:`ShuttingDown` after :meth:`drain`."""
        with self._wake:
            if self._draining:
                raise ShuttingDown("the server is shutting down: retry on another replica")
            if len(self._waiting) >= self.max_queue + self._free_slots():
                raise QueueFull(f"{self.gauges()['queued']} requests are waiting beyond the batch (--max-queue {self.max_queue})")
            self._waiting.append(job)
        self._matcher.submit(self._prepare, job)

    def compile(self, todo: list[tuple[str, str, list[int]]], method, owner=None, *, fresh: bool = True) -> dict:
        """Blocking, off the model thread: compile ``todo`` (``(key, text, ids)``) in pieces between
        decode steps and store each piece as it finishes; ``key -> KV`` (as a read of its entry
        returns it) of what was stored (all, unless ``owner.cancelled`` cut it short). ``fresh``
        (a new request): refused while draining."""
        if not todo:  # nothing to compile: never queued, so nothing is counted or left behind
            return {}
        work = CompileWork(todo, method, self.link_piece, self.engine.store, owner)
        with self._wake:
            if fresh and self._draining:
                raise ShuttingDown("the server is shutting down: retry on another replica")
            self.worker.compiles.append(work)
            self._wake.notify()
        return store_pieces(work)

    def drain(self) -> None:
        """Take no new job (running and waiting ones go on)."""
        with self._wake:
            self._draining = True

    def abort(self, exc: ShuttingDown) -> None:
        """End every job and compile still there with ``exc`` (on the loop's next turn)."""
        with self._wake:
            self._abort = exc
            self._wake.notify()

    def _free_slots(self) -> int:
        return max(0, self.max_batch - len(self.worker.running) - (self.worker.linking is not None))

    def gauges(self) -> dict[str, int]:
        """Requests by state: ``queued`` (beyond the batch: what ``max_queue`` bounds), ``matching``
        (against the store, in the batch), ``linking`` (admitted, link running or to start),
        ``decoding``, ``active`` (the three); and ``compiling``: compiles in progress."""
        free, waiting = self._free_slots(), list(self._waiting)
        inside = waiting[:free]  # FIFO: the first ``free`` waiting ones fill the batch
        out = {"queued": len(waiting) - len(inside), "matching": sum(j.plan is None for j in inside),
               "linking": (self.worker.linking is not None) + sum(j.plan is not None for j in inside),
               "decoding": len(self.worker.running)}
        out["active"] = out["matching"] + out["linking"] + out["decoding"]
        out["compiling"] = len(self.worker.compiles)
        return out

    @property
    def idle(self) -> bool:
        return not (self._waiting or self.worker.running or self.worker.linking or self.worker.compiles)

    # -- the matcher threads -----------------------------------------------------------------
    def _prepare(self, job: GenJob) -> None:
        """Match ``job`` against the store (compiling misses in pieces) and plan its link."""
        try:
            if job.cancelled:
                return  # the loop drops it
            compile_missing = lambda missing, method: self._compile_missing(job, missing, method)  # noqa: E731
            plan = begin(self.engine, job, self.pool, self.max_prompt_tokens, self.link_piece,
                         mine=job.tenant.owns if job.tenant else None, compile_missing=compile_missing,
                         cache_salt=job.tenant.name if job.tenant else "")
            rows, n = plan.req.kv_rows, plan.req.num_tokens
            if rows > self.max_kv_rows:
                plan.req.release()
                field = "max_tokens" if n <= self.max_kv_rows else "messages"
                raise BadRequest(f"the prompt ({n} tokens) and max_tokens "
                                 f"({rows - n}) need {rows} KV rows, more than this server's budget "
                                 f"of {self.max_kv_rows} (--max-kv-rows)", status=413, param=field,
                                 code="kv_budget_exceeded")
        except Exception as exc:
            with self._wake:
                if job not in self._waiting:
                    return  # dropped meanwhile (cancelled, aborted): counted there
                self._waiting.remove(job)
            failed(self.metrics, job, exc, where="match")
            return
        with self._wake:
            job.plan = plan
            self._wake.notify()

    def _compile_missing(self, job: GenJob, missing: list[tuple[str, str]], method) -> dict:
        got = self.compile(tokenized(self.engine, missing), method, job, fresh=False)
        if job.tenant is not None:
            job.tenant.note(list(got))  # the caller's own now: its next prompts find them
        return got

    # -- the loop ----------------------------------------------------------------------------
    def _loop(self) -> None:
        with torch.inference_mode():  # link's caches are inference tensors; decode writes them
            self._turns()
        self.worker.close()

    def _work(self) -> bool:
        return bool(self.worker.running or self.worker.linking or self.worker.compiles
                    or any(j.plan is not None or j.cancelled for j in self._waiting))

    def _turns(self) -> None:
        while True:
            with self._wake:
                while not (self._stop or self._abort or self._work()):
                    self._wake.wait()
                if self._stop:
                    break
                aborted, self._abort = self._abort, None
                state, items = self._snapshot(aborted is not None)
                turn = schedule(state)
                for i in (*turn.drop, *turn.admit):  # out of the queue (under the lock: submit counts it)
                    if isinstance(items[i], GenJob) and items[i] in self._waiting:
                        self._waiting.remove(items[i])
                if turn.admit:
                    self.worker.linking = items[turn.admit[0]].plan
                    items[id(self.worker.linking)] = self.worker.linking
            try:
                self.worker.execute(turn, items, aborted)
            except Exception:  # a bookkeeping bug must not stop the server's only model thread
                log.exception("scheduler turn failed")
            self._last_piece = postprocess(state, turn).last_piece

    def _snapshot(self, abort: bool) -> tuple[State, dict[int, object]]:
        items: dict[int, object] = {}
        waiting = []
        for j in self._waiting:
            items[id(j)] = j
            req = j.plan.req if j.plan is not None else None
            waiting.append(Request(id(j), ready=False, cancelled=j.cancelled) if req is None else
                           Request(id(j), req.kv_rows, req.linker.pieces, req.linker.piece_rows,
                                   cancelled=j.cancelled))
        linking = None
        if self.worker.linking is not None:
            run = self.worker.linking
            items[id(run)] = run
            ln = run.req.linker
            linking = Work(id(run), ln.pieces - ln.done_pieces, ln.piece_rows, run.req.kv_rows, run.job.cancelled)
        items.update({id(w): w for w in self.worker.compiles})
        items.update({id(r): r for r in self.worker.running})
        compiles = tuple(Work(id(w), w.pieces_left, w.next_rows, 0, w.cancelled) for w in self.worker.compiles)
        running = tuple(Decoding(id(r), r.req.kv_rows, r.job.cancelled)
                        for r in self.worker.running)
        return State(Limits(self.max_batch, self.max_kv_rows), tuple(waiting), linking, compiles, running,
                     self._last_piece, abort), items
