"""A corpus compile in this process: read, chunk, compile batch by batch, check the store.

The Ray path (:mod:`ragpic.corpus.on_ray`) runs the same steps spread over a cluster: the
chunking (:func:`cut`), the batch (:func:`ragpic.corpus.batch.compile_batch`) and the final
check (:func:`missing_keys`) are shared, so both store the same keys for the same corpus.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ragpic.corpus.batch import compile_batch
from ragpic.corpus.chunking import Chunker
from ragpic.corpus.job import SEPARATOR, CompileJob
from ragpic.corpus.report import CompileReport, Progress
from ragpic.corpus.sources import Doc
from ragpic.errors import ChunkError, StoreError

if TYPE_CHECKING:
    from ragpic.engine.engine import RagPic

__all__ = ["compile_behind", "compile_in_process", "cut", "missing_keys", "open_engine"]

CHECK_BATCH = 1000  # keys per existence query of the final check


def cut(doc: Doc, chunker: Chunker) -> list[tuple[str, str]]:
    """``(where, text)`` of each chunk of ``doc``; ``where`` is ``name#i`` (errors name it)."""
    return [(f"{doc.name}#{i}", t) for i, t in enumerate(chunker(doc))]


def open_engine(job: CompileJob, lm: Any = None) -> "RagPic":
    """The engine a worker compiles with; a store that cannot be opened is an error here (a
    query degrades to memory, ingest must not report chunks stored that are not)."""
    from ragpic.engine.engine import RagPic

    engine = RagPic(job.config(), lm=lm)
    if engine.store.backend is None:
        raise StoreError(f"store {job.store!r} could not be opened (see the warning above): nothing would be "
                         "kept; start the server or fix the folder and run again")
    try:  # a Redis backend connects lazily: ask once now, before any chunk is compiled for nothing
        engine.store.backend.contains_many(["0" * 64])
    except Exception as e:  # noqa: BLE001 - redis-py and sqlite raise their own types
        engine.store.close()
        raise StoreError(f"store {job.store!r} could not be opened: {type(e).__name__}: {e}; start the server "
                         "or fix the folder and run again") from e
    return engine


def missing_keys(store: Any, keys: Sequence[str]) -> list[str]:
    """The ``keys`` the store's backend does not hold, asked in batches (raises if it cannot answer)."""
    missing: list[str] = []
    for lo in range(0, len(keys), CHECK_BATCH):
        part = list(keys[lo:lo + CHECK_BATCH])
        missing += [k for k, held in zip(part, store.backend.contains_many(part)) if not held]
    return missing


def compile_in_process(job: CompileJob, docs: Iterable[Doc], *, progress: bool = True,
                       lm: Any = None) -> CompileReport:
    """Compile a corpus into ``job.store`` here, one batch of ``job.batch_chunks`` at a time.

    A killed run keeps every batch it finished; run it again and it compiles only the rest.
    ``lm``: an already loaded model (else ``job.model`` is loaded).
    """
    from ragpic.corpus.chunking import make_chunker

    t0 = time.perf_counter()
    engine = open_engine(job, lm)
    try:
        chunker = make_chunker(job.chunker, engine.lm.tokenizer, job.chunk_tokens)
        report, documents = CompileReport(), []
        for doc in docs:  # chunking is cheap beside compiling: cut all first, so the bar has a total
            report.documents += 1
            documents.append(cut(doc, chunker))
        chunks = [c for d in documents for c in d]
        keys: dict[str, None] = {}
        bar = Progress(len(chunks), progress)
        try:
            for lo in range(0, len(chunks), job.batch_chunks):
                batch = chunks[lo:lo + job.batch_chunks]
                result = compile_batch(engine, [t for _, t in batch], [w for w, _ in batch], on_compiled=bar.advance)
                keys.update(dict.fromkeys(result.keys))
                report.add(result)
                bar.update(result)
        finally:
            bar.close()
        if job.compile_behind:
            report.behind = compile_behind(engine, documents, progress=progress)
        report.distinct = len(keys)
        report.missing = len(missing_keys(engine.store, list(keys)))
    finally:
        engine.store.close()
    report.wall_s = time.perf_counter() - t0
    return report


def compile_behind(engine: "RagPic", documents: Sequence[Sequence[tuple[str, str]]], *, progress: bool = True) -> int:
    """Compile each document's chunks behind the ``config.compile_behind`` chunks before it
    (ARCHITECTURE §1.3), after their plain entries; how many entries were compiled.

    ``documents``: each document's ``(where, text)`` chunks in order (:func:`cut`). A chunk that
    fails raises :class:`ChunkError` naming it (``doc.md#3``).
    """
    from ragpic.engine.in_order import check_in_order, compile_in_order

    check_in_order(engine, engine.method_of(), SEPARATOR)
    bar = Progress(len(documents), progress, desc="compiling behind the chunks before (documents)")
    compiled = 0
    try:
        for chunks in documents:
            if len(chunks) > 1:  # checked by the plain batches' plans already
                try:
                    compiled += compile_in_order(engine, [t for _, t in chunks], SEPARATOR)
                except ChunkError as e:
                    raise ChunkError(f"{chunks[e.index or 0][0]}: {e}", e.index) from e
            bar.advance(1)
    finally:
        bar.close()
    return compiled
