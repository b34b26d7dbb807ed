"""How a request leaves the scheduler, and what each way counts in the metrics.

Every job ends in exactly one outcome of ``ragpic_requests_total``: ``ok`` (:func:`finished`),
``bad_request`` or ``error`` (:func:`failed`), ``cancelled`` (its client left) or ``shutdown``
(the shutdown grace ran out: :func:`dropped`); the HTTP side counts ``queue_full`` (429) and
``shutting_down`` (503) for requests never admitted.
"""

from __future__ import annotations

import logging
import time

from ragpic.serve.job import Done, Failed, GenJob
from ragpic.errors import BadRequest, QueueFull, ShuttingDown
from ragpic.serve.metrics import Metrics
from ragpic.serve.running import Running

__all__ = ["QueueFull", "ShuttingDown", "count_link", "dropped", "failed", "finished", "wait_idle"]

log = logging.getLogger("ragpic.serve")


def count_link(m: Metrics, run: Running) -> None:
    """A linked request: store hits and misses, and where its prompt tokens' KV came from."""
    g = run.result
    m.observe("link", g.link_s)
    if g.method != "full":  # full links no stored KV: neither a hit nor a miss
        m.inc("cache_hits", g.chunks_loaded)
        m.inc("cache_misses", max(0, g.chunks_matched - g.chunks_loaded))
    m.inc("chunks_compiled", g.chunks_compiled)
    m.inc("prompt_tokens", g.prompt_tokens)
    m.inc("cached_tokens", g.cached_tokens)
    m.inc("recomputed_tokens", g.recomputed_tokens)
    m.inc("link_rows", g.link_rows)


def finished(m: Metrics, run: Running) -> None:
    m.observe("ttft", run.result.ttft_s)
    m.inc("generated_tokens", len(run.result.token_ids))
    m.inc("requests", outcome="ok")
    run.job.send(Done(run.result))


def failed(m: Metrics, job: GenJob, exc: Exception, *, where: str) -> None:
    bad_request = isinstance(exc, (ValueError, BadRequest))  # ragpic's input errors subclass ValueError
    if not bad_request:
        log.exception("request failed in %s", where)
    m.inc("requests", outcome="bad_request" if bad_request else "error")
    job.send(Failed(exc))


def dropped(m: Metrics, job: GenJob, aborted: ShuttingDown | None) -> None:
    """A job ended before its answer: its client left (cancelled), or the grace ran out."""
    if aborted is not None and not job.cancelled:
        m.inc("requests", outcome="shutdown")
        job.send(Failed(aborted))
    else:
        m.inc("requests", outcome="cancelled")


def wait_idle(scheduler, timeout: float = 10.0) -> bool:
    """Wait until nothing runs or waits (tests); True when idle."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if scheduler.idle:
            return True
        time.sleep(0.01)
    return False
