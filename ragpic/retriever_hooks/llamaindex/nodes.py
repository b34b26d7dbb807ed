"""The exact text a LlamaIndex node becomes in a prompt: what ragpic compiles and looks for."""

from __future__ import annotations

from collections.abc import Iterable

from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore

__all__ = ["node_text", "node_texts"]



def node_text(node: BaseNode | NodeWithScore) -> str:
    """The exact text LlamaIndex's synthesizers put in the prompt for ``node`` ("" if none)."""
    if isinstance(node, NodeWithScore):
        node = node.node
    try:
        return (node.get_content(metadata_mode=MetadataMode.LLM) or "").strip()
    except (NotImplementedError, TypeError, ValueError):  # nodes without text (e.g. some media nodes)
        return ""


def node_texts(nodes: Iterable[BaseNode | NodeWithScore]) -> list[str]:
    return [t for t in (node_text(n) for n in nodes) if t]
