"""Compile a corpus into a store, once, before any query: ``ragpic compile``.

Documents (a folder of ``.txt``/``.md`` files, JSONL, or a LlamaIndex / LangChain loader's
documents) are cut into chunks exactly as the framework hooks will find them in prompts
(:mod:`ragpic.corpus.chunking`), compiled batch by batch and written into a store, in this
process (:func:`compile_corpus`) or on a Ray cluster (:func:`ragpic.corpus.on_ray.compile_on_ray`,
the ``ray`` extra). Keys are content addressed, so a run is idempotent and resumable: a second
run compiles nothing, a run killed half way compiles the rest. Every run ends by checking
that every chunk of the corpus is in the store (:attr:`CompileReport.missing`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ragpic.corpus.job import CompileJob
from ragpic.corpus.sources import Doc, doc_from, read_sources

if TYPE_CHECKING:  # importing the package stays light (no torch): the demo reads files through it
    from ragpic.corpus.report import CompileReport

__all__ = ["CompileJob", "Doc", "compile_corpus", "read_sources"]


def compile_corpus(job: CompileJob, documents: Iterable[Any], *, progress: bool = True,
                   lm: Any = None) -> "CompileReport":
    """Compile ``documents`` (:class:`Doc`, LlamaIndex or LangChain ``Document`` objects, dicts
    like JSONL lines, or strings) into ``job.store`` in this process.

    Example::

        from ragpic.corpus import CompileJob, compile_corpus
        report = compile_corpus(CompileJob(store="my_index/kv"), SimpleDirectoryReader("docs").load_data())
        assert report.ok, report.lines()
    """
    from ragpic.corpus.local import compile_in_process

    docs = (doc_from(d, i) for i, d in enumerate(documents))
    return compile_in_process(job, docs, progress=progress, lm=lm)
