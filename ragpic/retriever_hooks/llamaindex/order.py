"""A document's nodes in the order they have in it: compiled so at ingest, put so in prompts
(docs/ARCHITECTURE.md §1.3, ``Config(compile_behind=m)``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import BaseNode, NodeWithScore, QueryBundle

__all__ = ["DocumentOrder", "document_runs"]


def _doc(node: BaseNode) -> str:
    return node.ref_doc_id or node.node_id  # a node without a source document is its own document


def _start(node: BaseNode) -> float:
    return node.start_char_idx if node.start_char_idx is not None else float("inf")


def document_runs(nodes: Iterable[BaseNode]) -> list[list[BaseNode]]:
    """``nodes`` grouped by source document (documents in first-seen order), each group sorted
    by where its nodes start in the document (nodes without a start keep their order, last)."""
    runs: dict[str, list[BaseNode]] = {}
    for n in nodes:
        runs.setdefault(_doc(n), []).append(n)
    return [sorted(run, key=_start) for run in runs.values()]  # sorted() is stable


class DocumentOrder(BaseNodePostprocessor):
    """Retrieved nodes regrouped by document, each document's nodes in their order in it.

    Documents keep the rank of their best node; inside one, nodes follow ``start_char_idx``.
    With ``Config(compile_behind=m)`` and :class:`~ragpic.retriever_hooks.llamaindex.RagPicIngest`,
    a node retrieved right after the nodes before it in its document then links the KV compiled
    behind them. Put it last in ``node_postprocessors`` (after any that add neighbours, e.g.
    ``PrevNextNodePostprocessor``). Scores stay as retrieval gave them."""

    @classmethod
    def class_name(cls) -> str:
        return "RagPicDocumentOrder"

    def _postprocess_nodes(self, nodes: Sequence[NodeWithScore],
                           query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        by_node = {id(n.node): n for n in nodes}
        return [by_node[id(node)] for run in document_runs(n.node for n in nodes) for node in run]
