"""A document's chunks in the order they have in it: compiled so at ingest, put so in prompts,
behind the chain's own leading text (docs/ARCHITECTURE.md §1.3, ``Config(compile_behind=m,
compile_head=...)``).

A chunk's document is its ``metadata["source"]`` (what LangChain's loaders set) and its place
in it ``metadata["start_index"]`` (what a text splitter made with ``add_start_index=True``
sets); a chunk without a source is its own document, and chunks without a start keep the order
they come in, after those with one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from langchain_core.documents import Document
from langchain_core.prompts import BasePromptTemplate

from ragpic.engine.prompting import TEMPLATE_MARK, leading_text
from ragpic.errors import ConfigError

__all__ = ["document_order", "document_runs", "qa_head"]


def _start(doc: Document) -> float:
    start = doc.metadata.get("start_index")
    return start if isinstance(start, int) and not isinstance(start, bool) else float("inf")


def document_runs(docs: Iterable[Document]) -> list[list[Document]]:
    """``docs`` grouped by ``metadata["source"]`` (documents in first-seen order), each group
    sorted by ``metadata["start_index"]`` (stable: chunks without one keep their order, last)."""
    runs: dict[object, list[Document]] = {}
    for i, d in enumerate(docs):
        source = d.metadata.get("source")
        runs.setdefault(("source", source) if isinstance(source, str) and source else ("alone", i), []).append(d)
    return [sorted(run, key=_start) for run in runs.values()]


def document_order(docs: Sequence[Document]) -> list[Document]:
    """Retrieved documents regrouped by source, each source's chunks in their order in it;
    sources keep the rank of their best chunk. In a chain, between the retriever and the
    formatting: ``retriever | document_order | format_docs``. With ``Config(compile_behind=m)``
    and :func:`~ragpic.retriever_hooks.langchain.compile_documents`, a chunk retrieved right
    after the chunks before it in its document then links the KV compiled behind them."""
    return [d for run in document_runs(docs) for d in run]


def qa_head(prompt: BasePromptTemplate, context_key: str = "context") -> dict[str, str]:
    """``Config`` keyword arguments under which a document's chunks compiled in order read what
    ``prompt`` puts before them: ``compile_head``, the text its first human message (or, for a
    string template, the prompt) has before ``{context_key}``, and ``system_prompt`` when the
    template starts with a system message (without one, ragpic's chat models and LLMs put
    ``Config.system_prompt`` first, and your own stays as it is). Use as
    ``RagPic(Config(compile_behind=4, **qa_head(prompt)))``."""
    if not isinstance(prompt, BasePromptTemplate):
        raise ConfigError(f"prompt must be a LangChain prompt template (ChatPromptTemplate or PromptTemplate), "
                          f"got {type(prompt).__name__}")
    if context_key not in prompt.input_variables:
        raise ConfigError(f"context_key={context_key!r} is not one of the prompt's variables "
                          f"{sorted(prompt.input_variables)}: name the one your documents go into")
    value = prompt.invoke({v: (TEMPLATE_MARK if v == context_key else "") for v in prompt.input_variables})
    roles = {"system": "system", "human": "user"}
    system, head = leading_text([{"role": roles.get(m.type, m.type), "content": m.content if isinstance(m.content, str)
                                  else ""} for m in value.to_messages()], context_key)
    return {"compile_head": head, **({"system_prompt": system} if system is not None else {})}
