"""Ingest: compile each document's KV as it enters a vector store, before it is retrievable."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.documents import Document

from ragpic.retriever_hooks.langchain.documents import TextOf, page_text
from ragpic.retriever_hooks.langchain.order import document_runs

if TYPE_CHECKING:
    from langchain_core.vectorstores import VectorStore

    from ragpic.engine.engine import RagPic

__all__ = ["add_documents_with_kv", "compile_documents", "compile_vectorstore"]


def compile_documents(engine: RagPic, docs: Iterable[Document], *, text_of: TextOf = page_text,
                      progress: bool = False, separator: str = "\n\n") -> int:
    """Compile (and store) the KV of each document's prompt text; returns how many were new.

    Empty documents are skipped: they cannot be a cached chunk and cost nothing to compute.
    With ``Config(compile_behind=m)`` on the engine, each source's chunks (by
    ``metadata["source"]``, in ``metadata["start_index"]`` order:
    :func:`~ragpic.retriever_hooks.langchain.document_runs`) are also compiled behind the ``m``
    chunks before them, each followed by ``separator``, what your ``format_docs`` puts between
    two documents (docs/ARCHITECTURE.md §1.3); :func:`~ragpic.retriever_hooks.langchain.document_order`
    puts retrieved chunks in that order.
    """
    docs = [d for d in docs if text_of(d).strip()]
    done = engine.compile([text_of(d) for d in docs], progress=progress) if docs else 0
    if engine.config.compile_behind:
        for run in document_runs(docs):
            if len(run) > 1 or engine.config.compile_head:  # a lone chunk has only the head to read
                done += engine.compile([text_of(d) for d in run], in_order=True, separator=separator)
    return done


def add_documents_with_kv(store: VectorStore, docs: Sequence[Document], engine: RagPic, *,
                          text_of: TextOf = page_text, progress: bool = False, separator: str = "\n\n",
                          **kwargs: Any) -> list[str]:
    """``store.add_documents(docs, **kwargs)``, compiling each document's KV first.

    KV is compiled before the documents become retrievable, so no query can see a document
    whose KV is still missing (in order too with ``Config(compile_behind=m)``, each chunk
    followed by ``separator``: :func:`compile_documents`). Returns the ids ``add_documents``
    returns.
    """
    docs = list(docs)
    compile_documents(engine, docs, text_of=text_of, progress=progress, separator=separator)
    return store.add_documents(docs, **kwargs)


def _store_ids(store: VectorStore) -> list[str]:
    if hasattr(store, "index_to_docstore_id"):  # FAISS (also after load_local)
        return list(store.index_to_docstore_id.values())
    inner = getattr(store, "store", None)  # InMemoryVectorStore
    if isinstance(inner, dict):
        return list(inner)
    raise TypeError(f"cannot list the documents of a {type(store).__name__}; "
                    "call compile_documents(engine, docs) with them instead")


def compile_vectorstore(store: VectorStore, engine: RagPic, *, progress: bool = True,
                        text_of: TextOf = page_text, batch: int = 256, separator: str = "\n\n") -> int:
    """Compile the KV of every document already in ``store`` (FAISS or in-memory) that the
    engine's KV store lacks; returns how many were compiled (0 after a complete ingest). With
    ``Config(compile_behind=m)``, each source's chunks in order too (:func:`compile_documents`),
    read in one batch."""
    ids = _store_ids(store)
    if engine.config.compile_behind:  # a source's chunks in order need all of them at once
        batch = max(batch, len(ids))
    done = 0
    for lo in range(0, len(ids), batch):
        done += compile_documents(engine, store.get_by_ids(ids[lo:lo + batch]), text_of=text_of,
                                  progress=progress, separator=separator)
    return done
