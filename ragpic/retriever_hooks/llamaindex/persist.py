"""A FAISS vector index in a folder, with the KV store in ``folder/kv`` beside it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llama_index.core.schema import BaseNode, TransformComponent

from ragpic.config import kv_folder
from ragpic.retriever_hooks.llamaindex.ingest import RagPicIngest, compile_index

if TYPE_CHECKING:
    from ragpic.engine.engine import RagPic

__all__ = ["build_faiss_index", "kv_folder", "load_faiss_index", "persist_index"]



def _embed_dim(embed_model: Any) -> int:
    return len(embed_model.get_text_embedding("dimension probe"))


def build_faiss_index(documents: Sequence[BaseNode], engine: "RagPic", *, embed_model: Any,
                      transformations: Sequence[TransformComponent] | None = None,
                      folder: str | Path | None = None, show_progress: bool = False) -> Any:
    """A FAISS-backed ``VectorStoreIndex`` over ``documents`` with their KV compiled.

    ``transformations`` default to LlamaIndex's node parser; :class:`RagPicIngest` is
    appended. Documents that are already nodes are not re-split when ``transformations=[]``.
    When ``folder`` is given the index is persisted there (:func:`persist_index`); open
    the engine with ``Config(store=kv_folder(folder))`` so the KV lands beside it.
    """
    import faiss
    from llama_index.core import Settings, StorageContext, VectorStoreIndex
    from llama_index.vector_stores.faiss import FaissVectorStore

    if transformations is None:
        transformations = [Settings.node_parser]
    transformations = [*transformations, RagPicIngest(engine, progress=show_progress)]
    vector_store = FaissVectorStore(faiss_index=faiss.IndexFlatL2(_embed_dim(embed_model)))
    storage = StorageContext.from_defaults(vector_store=vector_store)
    index = VectorStoreIndex.from_documents(list(documents), storage_context=storage, embed_model=embed_model,
                                            transformations=transformations, show_progress=show_progress)
    if folder is not None:
        persist_index(index, folder)
    return index


def persist_index(index: Any, folder: str | Path) -> None:
    """Write the index (docstore, FAISS vectors, ...) to ``folder``. The KV store, opened at
    :func:`kv_folder`, persists by itself."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    index.storage_context.persist(persist_dir=str(folder))


def load_faiss_index(folder: str | Path, *, embed_model: Any, engine: "RagPic | None" = None,
                     compile_missing: bool = False, **kwargs: Any) -> Any:
    """Reload a FAISS index persisted by :func:`persist_index`.

    With ``engine`` and ``compile_missing``, nodes whose KV is not in the engine's store
    (e.g. the ``kv`` folder was deleted) are compiled now instead of at the first query.
    """
    from llama_index.core import StorageContext, load_index_from_storage
    from llama_index.vector_stores.faiss import FaissVectorStore

    vector_store = FaissVectorStore.from_persist_dir(str(folder))
    storage = StorageContext.from_defaults(vector_store=vector_store, persist_dir=str(folder))
    index = load_index_from_storage(storage, embed_model=embed_model, **kwargs)
    if engine is not None and compile_missing:
        compile_index(index, engine)
    return index
