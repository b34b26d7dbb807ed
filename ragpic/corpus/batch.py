"""One batch of a corpus compile on one worker: plan, compile, encode, write, each timed.

Every worker, in process or a Ray actor, runs :func:`compile_batch` on its own engine. A batch
is idempotent: the plan skips chunks the store already holds (content-addressed keys,
ARCHITECTURE §4.4) and an entry is written whole or not at all (payload before its meta key),
so a batch retried after its worker died writes only what the dead worker had not.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ragpic.engine.compile_pipeline import StoreWriter, compile_entries, text_jobs
from ragpic.engine.compile_plan import plan_compile
from ragpic.errors import ChunkError, StoreError

if TYPE_CHECKING:
    from ragpic.engine.engine import RagPic

__all__ = ["BatchResult", "Counts", "compile_batch", "worker_name"]


def worker_name() -> str:
    """``host:pid`` of this process: which worker did a batch (per-worker rates)."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(slots=True)
class Counts:
    """What compiling some chunks did, summed over a batch, a worker or a run.

    Attributes:
        chunks: chunk occurrences (repeats and short texts included).
        compiled / stored_before / short: distinct texts (per batch) compiled now / found in the
            store / under ``min_chunk_tokens`` (never cached or matched, so never compiled).
        tokens: tokens compiled now.
        compile_s / encode_s / write_s: the forward passes / quantizing and serializing / the
            store's I/O (the write path, docs/SCALING.md *Ingest on Ray*).
    """

    chunks: int = 0
    compiled: int = 0
    stored_before: int = 0
    short: int = 0
    tokens: int = 0
    compile_s: float = 0.0
    encode_s: float = 0.0
    write_s: float = 0.0

    def add(self, other: "Counts") -> None:
        for name in Counts.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass(slots=True)
class BatchResult(Counts):
    """One batch's :class:`Counts`, the worker (``host:pid``) that ran it, and the store key of
    every cacheable chunk in it (the run checks them all at its end)."""

    worker: str = ""
    keys: list[str] = field(default_factory=list)


def compile_batch(engine: "RagPic", texts: Sequence[str], wheres: Sequence[str], *,
                  on_compiled: Callable[[int], None] | None = None) -> BatchResult:
    """Compile and store the chunk ``texts`` the store lacks; ``wheres[i]`` names chunk ``i``
    (``doc.md#3``) in errors. ``on_compiled(n)``: ``n`` more chunks compiled (a progress bar).

    Raises:
        ChunkError: a chunk that cannot be compiled, naming its document and place.
        StoreError: a write that failed (the store is down or full): the batch is not done.
    """
    method = engine.method_of()
    out = BatchResult(chunks=len(texts), worker=worker_name())
    try:
        plan = plan_compile(engine, texts, method)
    except ChunkError as e:
        raise ChunkError(f"{wheres[e.index or 0]}: {e}", e.index) from e
    short = set(plan.skipped)
    out.short = len({t for i, t in enumerate(plan.texts) if i in short})
    out.keys = list(dict.fromkeys(k for i, k in enumerate(plan.keys) if i not in short))
    out.stored_before = len(out.keys) - len(plan.todo)
    if not plan.todo:
        return out
    where_of = {t: w for t, w in zip(texts, wheres)}
    t0 = time.perf_counter()  # compile_s counts tokenizing, as the forward passes' input
    jobs = text_jobs(engine.lm.tokenizer, plan.todo, [wheres[i] for i in plan.todo_at], plan.todo_at)
    writer = StoreWriter(engine.store, strict=True)
    try:
        compile_entries(engine.lm, jobs, method.recipe, batch_tokens=engine.config.batch_tokens, sink=writer,
                        on_progress=on_compiled)
    except StoreError as e:  # which documents this batch held: the run resumes from there
        raise StoreError(f"batch {wheres[0]} .. {wheres[-1]}: {e}") from e
    total = time.perf_counter() - t0
    if len(writer.written) != len(plan.todo):  # strict writes raise; a store that answered less must not pass
        held = set(writer.written)
        lost = [where_of[t] for k, t in plan.todo if k not in held]
        raise StoreError(f"{len(lost)} chunks were not stored (first: {lost[0]}); is the store full or read-only?")
    out.compiled, out.tokens = len(plan.todo), sum(len(j.ids) for j in jobs)
    out.compile_s, out.encode_s, out.write_s = total - writer.encode_s - writer.write_s, writer.encode_s, writer.write_s
    return out
