"""The server's side of one request: its job (the HTTP handler's events) and its engine request.

:func:`begin` matches a job's prompt against the store (compiling misses) and plans its link
(:meth:`ragpic.RagPic.plan`), on a matcher thread; the scheduler then links it in pieces
(:meth:`~ragpic.engine.request.LinkedRequest.link_piece`), :func:`start` picks its first token,
and :func:`step` runs one decode forward for a list of running requests
(:func:`~ragpic.engine.request.step_many`: batched when the model supports it). Those run on the
scheduler thread, the only one that touches the model. The request object is the engine's own,
so the server's answers, counts and timings are ``RagPic.generate``'s (docs/ARCHITECTURE.md §1.1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ragpic.engine.generation import Generation
from ragpic.engine.plan_options import PlanOptions
from ragpic.engine.request import LinkedRequest, step_many
from ragpic.serve.job import Delta, GenJob, Linked

if TYPE_CHECKING:
    from ragpic.engine.engine import RagPic

__all__ = ["Running", "admit", "begin", "start", "step"]


@dataclass(slots=True)
class Running:
    """A request on the scheduler: matched (``job.plan``), linking, then decoding."""

    job: GenJob
    req: LinkedRequest

    @property
    def done(self) -> bool:
        return self.req.done

    @property
    def result(self) -> Generation | None:
        return self.req.result


def begin(engine: "RagPic", job: GenJob, pool, max_prompt_tokens: int, piece_rows: int | None = None, *,
          mine=None, compile_missing=None, cache_salt: str = "") -> Running:
    """Match ``job``'s prompt against the store and plan its link (no model work: misses are
    compiled by ``compile_missing``, or by the engine at once; ``mine``: the store keys the
    caller may find, see :meth:`ragpic.RagPic.segments`; ``cache_salt``: whose kept leading
    text it may link, see :meth:`ragpic.RagPic.plan`).

    Raises what the engine raises for a bad request (``ConfigError``, ``LinkError``...) and
    :class:`ContextOverflowError` for a prompt over ``max_prompt_tokens``.
    """
    chat = job.messages is not None
    options = PlanOptions(pool=pool, piece_rows=piece_rows, max_prompt_tokens=max_prompt_tokens,
                          cache_salt=cache_salt, mine=mine, compile_missing=compile_missing)
    req = engine.plan(job.messages if chat else job.prompt, hints=job.hints, method=job.method, chat=chat,
                      arrived=job.arrived, options=options, **job.sampling)
    return Running(job, req)


def _send(run: Running, text: str) -> None:
    if text:
        run.job.send(Delta(text))


def start(run: Running) -> Running:
    """The linked request's first token (``run.done`` when that ended it: EOS first...)."""
    first = run.req.start()
    run.job.send(Linked(run.req.result))
    _send(run, first)
    return run


def admit(engine: "RagPic", job: GenJob, pool, max_prompt_tokens: int) -> Running:
    """Link ``job`` whole and emit its first token (:func:`begin`, the link, :func:`start`)."""
    run = begin(engine, job, pool, max_prompt_tokens)
    run.req.link()
    return start(run)


def step(engine: "RagPic", runs: Sequence[Running], batch: bool = True) -> bool:
    """One decode forward for every run in ``runs``, then each one's next token (its text sent).

    Returns False when the model's attention turned out not to honour a batched step (the
    step was then taken one request at a time, exactly; the caller should stop asking for batches).
    """
    texts, batch = step_many(engine.lm, [r.req for r in runs], batch)
    for r, text in zip(runs, texts):
        _send(r, text)
    return batch
