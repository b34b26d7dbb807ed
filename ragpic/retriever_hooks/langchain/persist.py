"""Persistence: a FAISS store in a folder, its compiled KV in ``kv_folder(folder)``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.documents import Document

from ragpic.retriever_hooks.langchain.documents import TextOf, page_text
from ragpic.retriever_hooks.langchain.ingest import compile_documents, compile_vectorstore

if TYPE_CHECKING:
    from langchain_core.embeddings import Embeddings

    from ragpic.engine.engine import RagPic

__all__ = ["faiss_from_documents", "load_faiss"]


def faiss_from_documents(docs: Sequence[Document], embedding: Embeddings, engine: RagPic, *,
                         text_of: TextOf = page_text, progress: bool = False, **kwargs: Any):
    """``FAISS.from_documents(docs, embedding, **kwargs)`` with each document's KV compiled."""
    from langchain_community.vectorstores import FAISS

    docs = list(docs)
    compile_documents(engine, docs, text_of=text_of, progress=progress)
    return FAISS.from_documents(docs, embedding, **kwargs)


def load_faiss(folder: str | Path, embeddings: Embeddings, engine: RagPic | None = None, *,
               index_name: str = "index", progress: bool = False, text_of: TextOf = page_text):
    """Load a FAISS store saved with ``save_local(folder)`` and, given ``engine`` (opened on
    ``kv_folder(folder)``), compile whatever KV is missing (nothing when the folder is complete).

    ``load_local`` unpickles the docstore: load only folders you wrote yourself.
    """
    from langchain_community.vectorstores import FAISS

    store = FAISS.load_local(str(folder), embeddings, index_name=index_name,
                             allow_dangerous_deserialization=True)
    if engine is not None:
        compile_vectorstore(store, engine, progress=progress, text_of=text_of)
    return store
