"""A corpus compile on a Ray cluster: Ray Data reads and chunks, an actor pool compiles.

The pipeline (docs/SCALING.md, *Ingest on Ray*):

1. one read task per source file (a folder's ``.txt``/``.md``, a ``.jsonl``), which cuts its
   documents into chunks with the same chunker as an in-process run (:func:`ragpic.corpus.local.cut`);
   the chunks are materialized so the bar has a total;
2. ``map_batches`` over an actor pool of ``workers`` actors, each holding one model
   (:class:`CompileWorker`), each batch compiled and written by the actor into the shared store
   (:func:`ragpic.corpus.batch.compile_batch`): the driver never holds KV;
3. the driver checks that every key of the corpus is in the store.

Faults: Ray Data restarts a dead actor and retries its batch (its actor pools default to
unlimited restarts and retries of work lost to a dead process); a batch is idempotent, so a
retry rewrites nothing the dead worker finished. An error in a batch (a chunk that cannot be
compiled, a store write that failed) is not retried: the run stops and says which chunk.
Ray is an optional extra (``pip install 'ragpic[ray]'``); nothing below ``ragpic.corpus``
imports it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ragpic.corpus.batch import BatchResult
from ragpic.corpus.job import CompileJob
from ragpic.corpus.report import CompileReport, Progress
from ragpic.corpus.sources import folder_files
from ragpic.errors import RagPicError, UsageError

__all__ = ["CompileWorker", "compile_on_ray", "source_units"]


def source_units(sources: list[str]) -> list[dict]:
    """One row per file to read, ``{"path", "name"}``: a folder's files named relative to it."""
    units = []
    for source in sources:
        path = Path(source).expanduser().resolve()
        if path.is_dir():
            units += [{"path": str(p), "name": p.relative_to(path).as_posix()} for p in folder_files(path)]
        elif path.exists():
            units.append({"path": str(path), "name": path.name})
        else:
            raise UsageError(f"SOURCE {source}: no such file or folder; pass a folder of .txt/.md files or a "
                             ".jsonl file")
    return units


class ChunkFiles:
    """Ray Data UDF: a file row -> its chunk rows ``{"where", "text"}`` (tokenizer only, no weights)."""

    def __init__(self, job: dict):
        from ragpic.core.model import load_tokenizer
        from ragpic.corpus.chunking import make_chunker

        job_ = CompileJob(**job)
        self.chunker = make_chunker(job_.chunker, load_tokenizer(job_.model), job_.chunk_tokens)

    def __call__(self, row: dict) -> list[dict]:
        from ragpic.corpus.local import cut
        from ragpic.corpus.sources import file_doc, read_jsonl

        path = Path(row["path"])
        docs = read_jsonl(path) if path.suffix.lower() == ".jsonl" else [file_doc(path, row["name"])]
        # a document with no chunk still counts as read: one empty row, dropped before compiling
        return [{"where": w, "text": t, "doc": int(i == 0)}
                for doc in docs for i, (w, t) in enumerate(cut(doc, self.chunker) or [(doc.name, "")])]


class CompileWorker:
    """Ray Data UDF on an actor: one model per actor; a batch of chunk rows -> one result row."""

    def __init__(self, job: dict, threads: int):
        import torch

        from ragpic.corpus.local import open_engine

        torch.set_num_threads(threads)  # this actor's CPUs: workers on one node must not oversubscribe
        self.engine = open_engine(CompileJob(**job))

    def __call__(self, batch: dict) -> dict:
        from ragpic.corpus.batch import compile_batch

        rows = [(w, t) for w, t in zip(batch["where"], batch["text"]) if t]
        result = compile_batch(self.engine, [t for _, t in rows], [w for w, _ in rows])
        return {"result": [json.dumps(asdict(result))], "fingerprint": [self.engine.lm.fingerprint]}


def _ragpic_error(exc: BaseException) -> BaseException:
    """The ragpic error inside a Ray error (Ray wraps a worker's exception, sometimes twice)."""
    seen = exc
    while seen is not None:
        if isinstance(seen, RagPicError):
            return seen
        seen = getattr(seen, "cause", None) or seen.__cause__
    return exc


def compile_on_ray(job: CompileJob, sources: list[str], *, address: str | None = None, workers: int = 1,
                   cpus_per_worker: int = 1, progress: bool = True) -> CompileReport:
    """Compile ``sources`` into ``job.store`` on the Ray cluster at ``address`` (``None``: a local one).

    Raises:
        UsageError: a source that cannot be read, or ``job.compile_behind`` set (in process only).
        ChunkError / StoreError: from a batch, naming the chunk.
        ImportError: Ray is not installed (``pip install 'ragpic[ray]'``).
    """
    if job.compile_behind:  # a batch holds any chunks, so a document's may be split between workers
        raise UsageError("compile_behind runs in process (compile_corpus / ragpic compile without --ray): "
                         "a Ray batch may split a document's chunks")
    import ray

    t0 = time.perf_counter()
    units = source_units(sources)
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False  # ours shows chunks, tokens/s and ETA
        report = CompileReport(ray=True)
        try:
            chunks = ray.data.from_items(units).flat_map(
                ChunkFiles, fn_constructor_kwargs={"job": job.to_dict()}, concurrency=1, num_cpus=cpus_per_worker,
            ).materialize()
            report.documents = chunks.sum("doc") if chunks.count() else 0
            total = chunks.filter(lambda r: bool(r["text"])).count() if report.documents else 0
            results = chunks.map_batches(
                CompileWorker, fn_constructor_kwargs={"job": job.to_dict(), "threads": cpus_per_worker},
                batch_size=job.batch_chunks, concurrency=workers, num_cpus=cpus_per_worker, batch_format="numpy")
            keys, fingerprint = _run(results, report, Progress(total, progress))
        except Exception as exc:  # noqa: BLE001 - Ray wraps our errors; re-raise the ragpic one
            inner = _ragpic_error(exc)
            if inner is exc:
                raise
            raise inner from None
        report.distinct = len(keys)
        report.missing = len(_missing(job, fingerprint, keys)) if keys else 0
    finally:
        if started:
            ray.shutdown()
    report.wall_s = time.perf_counter() - t0
    return report


def _run(results: Any, report: CompileReport, bar: Progress) -> tuple[list[str], str]:
    keys: dict[str, None] = {}
    fingerprint = ""
    try:
        for row in results.iter_rows():
            result = BatchResult(**json.loads(row["result"]))
            keys.update(dict.fromkeys(result.keys))
            fingerprint = str(row["fingerprint"])
            report.add(result)
            bar.update(result)
    finally:
        bar.close()
    return list(keys), fingerprint


def _missing(job: CompileJob, fingerprint: str, keys: list[str]) -> list[str]:
    from ragpic.cache import open_store
    from ragpic.corpus.local import missing_keys
    from ragpic.errors import StoreError

    store = open_store(job.store, fingerprint=fingerprint, memory_bytes=0, budget_s=5.0)
    try:
        if store.backend is None:
            raise StoreError(f"store {job.store!r} could not be opened to check the run: its chunks are unverified")
        return missing_keys(store, keys)
    finally:
        store.close()
