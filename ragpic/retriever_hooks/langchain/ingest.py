"""Ingest: compile each document's KV as it enters a vector store, before it is retrievable."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.documents import Document

from ragpic.retriever_hooks.langchain.documents import TextOf, page_text

if TYPE_CHECKING:
    from langchain_core.vectorstores import VectorStore

    from ragpic.engine.engine import RagPic

__all__ = ["add_documents_with_kv", "compile_documents", "compile_vectorstore"]


def compile_documents(engine: RagPic, docs: Iterable[Document], *, text_of: TextOf = page_text,
                      progress: bool = False) -> int:
    """Compile (and store) the KV of each document's prompt text; returns how many were new.

    Empty documents are skipped: they cannot be a cached chunk and cost nothing to compute.
    """
    texts = [t for t in (text_of(d) for d in docs) if t.strip()]
    return engine.compile(texts, progress=progress) if texts else 0


def add_documents_with_kv(store: VectorStore, docs: Sequence[Document], engine: RagPic, *,
                          text_of: TextOf = page_text, progress: bool = False, **kwargs: Any) -> list[str]:
    """``store.add_documents(docs, **kwargs)``, compiling each document's KV first.

    KV is compiled before the documents become retrievable, so no query can see a document
    whose KV is still missing. Returns the ids ``add_documents`` returns.
    """
    docs = list(docs)
    compile_documents(engine, docs, text_of=text_of, progress=progress)
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
                        text_of: TextOf = page_text, batch: int = 256) -> int:
    """Compile the KV of every document already in ``store`` (FAISS or in-memory) that the
    engine's KV store lacks; returns how many were compiled (0 after a complete ingest)."""
    ids = _store_ids(store)
    done = 0
    for lo in range(0, len(ids), batch):
        done += compile_documents(engine, store.get_by_ids(ids[lo:lo + batch]), text_of=text_of,
                                  progress=progress)
    return done
