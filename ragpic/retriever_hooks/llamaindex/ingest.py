"""Compile node KV as nodes enter an index: a ``TransformComponent``, and a catch-up for
existing indexes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.schema import BaseNode, TransformComponent

from ragpic.retriever_hooks.llamaindex.nodes import node_texts
from ragpic.retriever_hooks.llamaindex.order import document_runs

if TYPE_CHECKING:
    from ragpic.engine.engine import RagPic

__all__ = ["RagPicIngest", "compile_index"]



class RagPicIngest(TransformComponent):
    """Compile and store each node's KV exactly as it will appear in prompts.

    Put it **last** in the transformations (after splitters and metadata extractors): it
    compiles :func:`node_text` of the nodes it sees and returns them unchanged. Works in
    ``IngestionPipeline(transformations=[...])``, ``VectorStoreIndex.from_documents(...,
    transformations=[...])`` and ``index.insert(doc)`` (which reuses the index's
    transformations). ``index.insert_nodes`` runs no transformations, and an
    ``IngestionPipeline`` cache hit skips them: call :func:`compile_index` afterwards in
    those cases (it only compiles what the store lacks). With ``Config(compile_behind=m)`` on
    the engine, each document's nodes (by ``ref_doc_id``, in ``start_char_idx`` order) are also
    compiled behind the ``m`` nodes before them (docs/ARCHITECTURE.md §1.3).

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
        show = self.progress or bool(kwargs.get("show_progress"))
        _compile(self._engine, nodes, self.method, show)
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


def _compile(engine: "RagPic", nodes: Sequence[BaseNode], method: str | None, progress: bool) -> int:
    """Every node's KV; with ``compile_behind``, each document's nodes in order behind the ones before."""
    texts = node_texts(nodes)
    done = engine.compile(texts, method=method, progress=progress and len(texts) > 1)
    if engine.config.compile_behind:
        for run in document_runs(nodes):
            if len(texts := node_texts(run)) > 1 or engine.config.compile_head:  # a lone node reads the head
                done += engine.compile(texts, method=method, in_order=True)
    return done


def compile_index(index: Any, engine: "RagPic", *, progress: bool = True, method: str | None = None) -> int:
    """Compile the KV of every node of an existing (e.g. reloaded) index; return how many
    were compiled (nodes already in the store are skipped; with ``Config(compile_behind=m)``,
    the entries behind each document's earlier nodes are counted too)."""
    return _compile(engine, _index_nodes(index), method, progress)
