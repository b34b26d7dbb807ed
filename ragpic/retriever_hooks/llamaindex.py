"""LlamaIndex hooks: compile node KV at ingest, pass retrieved node texts to the LLM.

What LlamaIndex puts in a prompt for a retrieved node is
``node.get_content(metadata_mode=MetadataMode.LLM).strip()`` (the LLM-visible metadata lines,
a blank line, the text); the default ``compact`` synthesizer joins those with ``"\\n\\n"``
inside the text-QA template. :func:`node_text` is that string, and it is what
:class:`RagPicIngest` and :func:`compile_index` compile, so the engine finds each node
verbatim in the prompt and links its stored KV.

Retrieval hints: :func:`install_retrieval_hints` adds one handler to LlamaIndex's root
instrumentation dispatcher. On every ``RetrievalEndEvent`` it stores the retrieved nodes'
texts in a :class:`~contextvars.ContextVar`; :class:`ragpic.llm.llamaindex.RagPicLLM` reads
it when called. Retrieval and synthesis of one query run in the same context (same thread,
or the same asyncio task), so this works for ``query``, ``aquery`` and streaming queries,
and concurrent queries in other threads or tasks never see each other's hints. The LLM
uses them only when the retrieval's query string is in its prompt (so an unrelated call
after a query ignores them). Hints only narrow the search: without them the engine looks
for every stored chunk in the prompt.

Persistence: :func:`build_faiss_index` / :func:`persist_index` / :func:`load_faiss_index`
keep a FAISS vector index in a folder and the KV store in ``folder/kv``
(:func:`kv_folder`), so a fresh process reloads both and links without compiling.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.retrieval import RetrievalEndEvent
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, TransformComponent

if TYPE_CHECKING:
    from ragpic.engine import RagPic

__all__ = [
    "RagPicIngest",
    "build_faiss_index",
    "compile_index",
    "current_hints",
    "hints_for",
    "install_retrieval_hints",
    "kv_folder",
    "load_faiss_index",
    "node_text",
    "persist_index",
    "retrieval_hints",
]

# ----- the text a node becomes in the prompt --------------------------------------------


def node_text(node: BaseNode | NodeWithScore) -> str:
    """The exact text LlamaIndex's synthesizers put in the prompt for ``node`` ("" if none)."""
    if isinstance(node, NodeWithScore):
        node = node.node
    try:
        return (node.get_content(metadata_mode=MetadataMode.LLM) or "").strip()
    except (NotImplementedError, TypeError, ValueError):  # nodes without text (e.g. some media nodes)
        return ""


def _texts(nodes: Iterable[BaseNode | NodeWithScore]) -> list[str]:
    return [t for t in (node_text(n) for n in nodes) if t]


# ----- retrieval hints ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Hints:
    query: str | None  # the retrieval's query string; None when set by hand
    texts: tuple[str, ...]


_HINTS: ContextVar[_Hints | None] = ContextVar("ragpic_llamaindex_hints", default=None)


def current_hints() -> tuple[str, ...] | None:
    """The node texts of the latest retrieval in this context (thread / asyncio task), if any."""
    h = _HINTS.get()
    return h.texts if h is not None else None


def hints_for(prompt: str) -> tuple[str, ...] | None:
    """The hints that belong to ``prompt``: those of the latest retrieval in this context if
    its query string appears in the prompt (every LlamaIndex QA/refine template contains
    it), else ``None`` (stale hints of an earlier query; the engine then searches the store's
    catalog). Hints set with :func:`retrieval_hints` always apply."""
    h = _HINTS.get()
    if h is None or (h.query and h.query not in prompt):
        return None
    return h.texts


@contextlib.contextmanager
def retrieval_hints(nodes_or_texts: Iterable[BaseNode | NodeWithScore | str]) -> Iterator[None]:
    """Set the hints by hand for the calls inside the ``with`` block (custom pipelines)."""
    texts = tuple(x.strip() if isinstance(x, str) else node_text(x) for x in nodes_or_texts)
    token = _HINTS.set(_Hints(None, tuple(dict.fromkeys(t for t in texts if t))))
    try:
        yield
    finally:
        _HINTS.reset(token)


def _query_str(q: Any) -> str:
    return q if isinstance(q, str) else (getattr(q, "query_str", "") or "")


class _RetrievalHintHandler(BaseEventHandler):
    """Root-dispatcher handler: retrieved node texts -> ``_HINTS`` of the current context.

    Not cleared when the query ends: a streaming response calls the LLM lazily, when the
    caller iterates it, after ``QueryEndEvent``. :func:`hints_for` drops stale hints instead.
    """

    @classmethod
    def class_name(cls) -> str:
        return "RagPicRetrievalHintHandler"

    def handle(self, event: Any, **kwargs: Any) -> None:
        if isinstance(event, RetrievalEndEvent):
            texts = tuple(dict.fromkeys(_texts(event.nodes)))
            _HINTS.set(_Hints(_query_str(event.str_or_query_bundle), texts))


_install_lock = threading.Lock()
_handler: _RetrievalHintHandler | None = None


def install_retrieval_hints() -> None:
    """Add the hint handler to LlamaIndex's root dispatcher (once per process; idempotent).

    :class:`~ragpic.llm.llamaindex.RagPicLLM` calls this when created, so a plain
    ``index.as_query_engine(llm=RagPicLLM(engine))`` passes hints without anything else.
    """
    global _handler
    with _install_lock:
        if _handler is None:
            _handler = _RetrievalHintHandler()
            get_dispatcher().add_event_handler(_handler)


# ----- ingest ---------------------------------------------------------------------------


class RagPicIngest(TransformComponent):
    """Compile and store each node's KV exactly as it will appear in prompts.

    Put it **last** in the transformations (after splitters and metadata extractors): it
    compiles :func:`node_text` of the nodes it sees and returns them unchanged. Works in
    ``IngestionPipeline(transformations=[...])``, ``VectorStoreIndex.from_documents(...,
    transformations=[...])`` and ``index.insert(doc)`` (which reuses the index's
    transformations). ``index.insert_nodes`` runs no transformations, and an
    ``IngestionPipeline`` cache hit skips them: call :func:`compile_index` afterwards in
    those cases (it only compiles what the store lacks).

    Args:
        engine: the :class:`ragpic.RagPic` whose store receives the KV.
        progress: show a progress bar (also shown when the pipeline runs with ``show_progress``).
        method: link method whose compile recipe to use (default: the engine's).
    """

    progress: bool = Field(default=False, description="Show a compile progress bar.")
    method: str | None = Field(default=None, description="Link method (compile recipe); engine default if None.")
    _engine: Any = PrivateAttr()

    def __init__(self, engine: "RagPic", *, progress: bool = False, method: str | None = None, **kwargs: Any):
        super().__init__(progress=progress, method=method, **kwargs)
        self._engine = engine

    @classmethod
    def class_name(cls) -> str:
        return "RagPicIngest"

    @property
    def engine(self) -> "RagPic":
        return self._engine

    def __call__(self, nodes: Sequence[BaseNode], **kwargs: Any) -> Sequence[BaseNode]:
        texts = _texts(nodes)
        show = self.progress or bool(kwargs.get("show_progress"))
        self._engine.compile(texts, method=self.method, progress=show and len(texts) > 1)
        return nodes

    async def acall(self, nodes: Sequence[BaseNode], **kwargs: Any) -> Sequence[BaseNode]:
        return await asyncio.to_thread(self.__call__, nodes, **kwargs)


def _index_nodes(index: Any) -> list[BaseNode]:
    nodes = list(index.docstore.docs.values())
    if nodes:
        return nodes
    vs = getattr(index, "vector_store", None)
    if vs is not None and getattr(vs, "stores_text", False):
        try:  # vector stores that keep the text themselves (docstore left empty)
            return list(vs.get_nodes())
        except (NotImplementedError, TypeError, ValueError):
            pass
    return []


def compile_index(index: Any, engine: "RagPic", *, progress: bool = True, method: str | None = None) -> int:
    """Compile the KV of every node of an existing (e.g. reloaded) index; return how many
    were compiled (nodes already in the store are skipped)."""
    return engine.compile(_texts(_index_nodes(index)), method=method, progress=progress)


# ----- persistence ----------------------------------------------------------------------


def kv_folder(folder: str | Path) -> str:
    """Where the KV store of the index persisted in ``folder`` lives: ``folder/kv``.

    Use it as ``Config(store=kv_folder(folder))``.
    """
    return str(Path(folder) / "kv")


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
