"""LangChain side of ingest and retrieval: compile chunk KV as documents enter a vector store,
and tell the ragpic LLM which documents a chain retrieved.

Ingest compiles the exact text the chain puts in the prompt. With the usual
``format_docs = lambda docs: "\\n\\n".join(d.page_content for d in docs)`` that is
``doc.page_content``; pass ``text_of=`` when your chain formats documents differently.

Retrieval hints: LCEL runs every step in a copied context, so a ``ContextVar`` set in a
retriever never reaches the LLM. :class:`RetrievalHints` is a callback handler instead: it
files each retriever's documents under the root run of the chain and hands them to the
ragpic LLM of the same root run. Wire it once::

    chain = (... | llm | StrOutputParser()).with_config(callbacks=[llm.hints])

Hints only narrow the search: without them the engine looks for every stored chunk's text in
the prompt, so answers are the same either way (the hints save that scan).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document

from ragpic.config import kv_folder

if TYPE_CHECKING:
    from langchain_core.embeddings import Embeddings
    from langchain_core.messages import BaseMessage
    from langchain_core.vectorstores import VectorStore

    from ragpic.engine import RagPic

__all__ = [
    "RetrievalHints",
    "add_documents_with_kv",
    "compile_documents",
    "compile_vectorstore",
    "faiss_from_documents",
    "kv_folder",
    "load_faiss",
    "messages_key",
    "page_text",
    "prompt_key",
]

TextOf = Callable[[Document], str]


def page_text(doc: Document) -> str:
    """The text ``format_docs`` puts in the prompt for ``doc``: its ``page_content``."""
    return doc.page_content


# ----- ingest ---------------------------------------------------------------------------------

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


def faiss_from_documents(docs: Sequence[Document], embedding: Embeddings, engine: RagPic, *,
                         text_of: TextOf = page_text, progress: bool = False, **kwargs: Any):
    """``FAISS.from_documents(docs, embedding, **kwargs)`` with each document's KV compiled."""
    from langchain_community.vectorstores import FAISS

    docs = list(docs)
    compile_documents(engine, docs, text_of=text_of, progress=progress)
    return FAISS.from_documents(docs, embedding, **kwargs)


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


# ----- retrieval hints ------------------------------------------------------------------------

def prompt_key(prompt: str) -> str:
    """Key of a completion prompt, as both the handler and the LLM see it."""
    return hashlib.blake2b(prompt.encode(), digest_size=16).hexdigest()


def messages_key(messages: Sequence[BaseMessage]) -> str:
    """Key of a chat prompt (roles and text of every message)."""
    return prompt_key("\x1e".join(f"{m.type}\x1f{m.text}" for m in messages))


class RetrievalHints(BaseCallbackHandler):
    """Callback handler: documents retrieved in a chain run -> hints for that run's ragpic LLM.

    Every run's root is found from its parent (start events arrive parent first); retrieved
    texts are filed under the root, and each LLM start files its prompt under its root too, so
    the LLM looks its hints up by prompt (LangChain does not give a chat model's ``_stream``
    its run id). A root's entries are dropped when it ends; at most ``max_roots`` are kept.

    Args:
        text_of: document -> the exact text the chain puts in the prompt.
        max_roots: bound on concurrently remembered root runs (oldest dropped first).
    """

    run_inline = True  # record before the next step starts, also under the async manager
    raise_error = False

    def __init__(self, text_of: TextOf = page_text, max_roots: int = 1024):
        self.text_of = text_of
        self.max_roots = max_roots
        self._lock = threading.Lock()
        self._root_of: dict[UUID, UUID] = {}
        self._tree: OrderedDict[UUID, list[UUID]] = OrderedDict()  # root -> its runs
        self._docs: dict[UUID, list[str]] = {}  # root -> retrieved texts, in order
        self._prompts: dict[str, UUID] = {}  # prompt key -> root of the LLM run

    # -- bookkeeping ---------------------------------------------------------------------------
    def _note(self, run_id: UUID, parent_run_id: UUID | None) -> UUID:
        with self._lock:
            root = self._root_of.get(parent_run_id, parent_run_id) if parent_run_id else run_id
            self._root_of[run_id] = root
            if root not in self._tree:
                self._tree[root] = []
                while len(self._tree) > self.max_roots:
                    self._forget_locked(next(iter(self._tree)))
            self._tree[root].append(run_id)
            return root

    def _forget_locked(self, root: UUID) -> None:
        for r in self._tree.pop(root, ()):
            self._root_of.pop(r, None)
        self._docs.pop(root, None)
        for k in [k for k, v in self._prompts.items() if v == root]:
            del self._prompts[k]

    def _end(self, run_id: UUID, parent_run_id: UUID | None) -> None:
        if parent_run_id is None:
            with self._lock:
                self._forget_locked(run_id)

    # -- events --------------------------------------------------------------------------------
    def on_chain_start(self, serialized, inputs, *, run_id: UUID, parent_run_id: UUID | None = None,
                       **kwargs: Any) -> None:
        self._note(run_id, parent_run_id)

    def on_retriever_start(self, serialized, query, *, run_id: UUID, parent_run_id: UUID | None = None,
                           **kwargs: Any) -> None:
        self._note(run_id, parent_run_id)

    def on_retriever_end(self, documents, *, run_id: UUID, parent_run_id: UUID | None = None,
                         **kwargs: Any) -> None:
        if parent_run_id is None:  # a retriever called alone: no LLM will follow in this run
            return
        with self._lock:
            root = self._root_of.get(run_id)
        if root is None:
            root = self._note(run_id, parent_run_id)
        texts = [self.text_of(d) for d in documents]
        with self._lock:
            if root in self._tree:
                self._docs.setdefault(root, []).extend(t for t in texts if t.strip())

    def on_llm_start(self, serialized, prompts, *, run_id: UUID, parent_run_id: UUID | None = None,
                     **kwargs: Any) -> None:
        root = self._note(run_id, parent_run_id)
        with self._lock:
            for p in prompts:
                self._prompts[prompt_key(p)] = root

    def on_chat_model_start(self, serialized, messages, *, run_id: UUID,
                            parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        root = self._note(run_id, parent_run_id)
        with self._lock:
            for msgs in messages:
                self._prompts[messages_key(msgs)] = root

    def on_chain_end(self, outputs, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._end(run_id, parent_run_id)

    def on_chain_error(self, error, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._end(run_id, parent_run_id)

    def on_llm_end(self, response, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._end(run_id, parent_run_id)

    def on_llm_error(self, error, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._end(run_id, parent_run_id)

    # -- lookup --------------------------------------------------------------------------------
    def texts_for(self, key: str) -> list[str]:
        """Texts retrieved in the root run whose LLM was started with prompt ``key``."""
        with self._lock:
            root = self._prompts.get(key)
            return list(dict.fromkeys(self._docs.get(root, ()))) if root is not None else []

    def __len__(self) -> int:
        with self._lock:
            return len(self._tree)
