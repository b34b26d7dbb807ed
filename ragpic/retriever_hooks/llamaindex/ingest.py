"""Compile node KV as nodes enter an index: a ``TransformComponent``, and a catch-up for
existing indexes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.schema import BaseNode, TransformComponent

from ragpic.retriever_hooks.llamaindex.nodes import node_texts

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
        texts = node_texts(nodes)
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
    return engine.compile(node_texts(_index_nodes(index)), method=method, progress=progress)
