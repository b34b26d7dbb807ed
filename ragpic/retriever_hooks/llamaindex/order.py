"""A document's nodes in the order they have in it: compiled so at ingest, put so in prompts,
behind the query engine's own leading text (docs/ARCHITECTURE.md §1.3, ``Config(compile_behind=m,
compile_head=...)``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from llama_index.core.base.llms.types import MessageRole
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.prompts import BasePromptTemplate
from llama_index.core.prompts.chat_prompts import CHAT_TEXT_QA_PROMPT
from llama_index.core.schema import BaseNode, NodeWithScore, QueryBundle

from ragpic.engine.prompting import TEMPLATE_MARK, leading_text
from ragpic.errors import ConfigError

__all__ = ["DocumentOrder", "document_runs", "qa_head"]


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


def qa_head(template: BasePromptTemplate | None = None) -> dict[str, str | None]:
    """``Config`` keyword arguments under which a document's nodes compiled in order read what
    a query engine puts before them: ``{"system_prompt": ..., "compile_head": ...}``.

    ``template``: the query engine's text-QA template as :class:`~ragpic.llm.llamaindex.RagPicLLM`
    receives it (a chat model's): LlamaIndex's default ``CHAT_TEXT_QA_PROMPT`` when ``None``,
    which brings its own system message, so entries compiled behind ragpic's own chat opening
    would never link under it. Its system message becomes ``system_prompt`` (``None`` without
    one: the model's template then adds its default to both), the text its user message has
    before ``{context_str}`` becomes ``compile_head``. Use as
    ``RagPic(Config(compile_behind=4, **qa_head()))`` and pass the same ``template`` to the
    query engine (``text_qa_template=``) if it is not the default."""
    template = CHAT_TEXT_QA_PROMPT if template is None else template
    try:
        messages = template.format_messages(context_str=TEMPLATE_MARK, query_str="")
    except Exception as e:  # noqa: BLE001  (a template whose variables are others)
        raise ConfigError(f"template must be a text-QA template with {{context_str}} and {{query_str}}: "
                          f"formatting it failed with {e!r}") from e
    system, head = leading_text([{"role": m.role.value if isinstance(m.role, MessageRole) else str(m.role),
                                  "content": m.content or ""} for m in messages], "context_str")
    return {"system_prompt": system, "compile_head": head}
