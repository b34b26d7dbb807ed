"""A document's chunks in the order they have in it: compiled so at ingest, put so in prompts,
behind the chain's own leading text (docs/ARCHITECTURE.md §1.3, ``Config(compile_behind=m,
compile_head=...)``).

A chunk's document is its ``metadata["source"]`` (what LangChain's loaders set) and its place
in it ``metadata["start_index"]`` (what a text splitter made with ``add_start_index=True``
sets); a chunk without a source is its own document, and chunks without a start keep the order
they come in, after those with one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.prompts import BasePromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable

from ragpic.engine.prompting import TEMPLATE_MARK, leading_text
from ragpic.errors import ConfigError

__all__ = ["document_order", "document_runs", "qa_head", "with_neighbours"]


def _source(doc: Document) -> str | None:
    source = doc.metadata.get("source")
    return source if isinstance(source, str) and source else None


def _start(doc: Document) -> float:
    start = doc.metadata.get("start_index")
    return start if isinstance(start, int) and not isinstance(start, bool) else float("inf")


def document_runs(docs: Iterable[Document]) -> list[list[Document]]:
    """``docs`` grouped by ``metadata["source"]`` (documents in first-seen order), each group
    sorted by ``metadata["start_index"]`` (stable: chunks without one keep their order, last)."""
    runs: dict[object, list[Document]] = {}
    for i, d in enumerate(docs):
        source = _source(d)
        runs.setdefault(("source", source) if source else ("alone", i), []).append(d)
    return [sorted(run, key=_start) for run in runs.values()]


def document_order(docs: Sequence[Document]) -> list[Document]:
    """Retrieved documents regrouped by source, each source's chunks in their order in it;
    sources keep the rank of their best chunk. In a chain, between the retriever and the
    formatting: ``retriever | document_order | format_docs``. With ``Config(compile_behind=m)``
    and :func:`~ragpic.retriever_hooks.langchain.compile_documents`, a chunk retrieved right
    after the chunks before it in its document then links the KV compiled behind them."""
    return [d for run in document_runs(docs) for d in run]


def _place(doc: Document) -> tuple[str, int] | None:
    """``(source, start_index)``: where a chunk is in its document, when its metadata says."""
    source, start = _source(doc), _start(doc)
    return (source, int(start)) if source and start != float("inf") else None


def _runs_around(chunks: Sequence[Document], n: int) -> Callable[[Sequence[Document]], list[Document]]:
    """docs -> each with up to ``n`` chunks either side of it in its document, from ``chunks``;
    each chunk once, the first copy seen kept."""
    where = {place: (run, i) for run in document_runs(chunks) for i, d in enumerate(run) if (place := _place(d))}

    def around(docs: Sequence[Document]) -> list[Document]:
        out, seen = [], set()
        for d in docs:
            run, i = where.get(_place(d), (None, 0))
            group = [d] if run is None or run[i].page_content != d.page_content else [
                *run[max(0, i - n):i], d, *run[i + 1:i + 1 + n]]
            for g in group:
                key = _place(g) or id(g)
                if key not in seen:
                    seen.add(key)
                    out.append(g)
        return out

    return around


class _WithNeighbours(BaseRetriever):
    """A retriever whose hits come with their neighbours (:func:`with_neighbours`). A retriever,
    not a step after one, so that :class:`~ragpic.retriever_hooks.langchain.RetrievalHints`
    hears of the neighbours too: hints narrow the engine's search to what was retrieved."""

    retriever: Runnable
    around: Callable[[Sequence[Document]], list[Document]]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return self.around(self.retriever.invoke(query, config={"callbacks": run_manager.get_child()}))

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun) -> list[Document]:
        return self.around(await self.retriever.ainvoke(query, config={"callbacks": run_manager.get_child()}))


def with_neighbours(retriever: Runnable, chunks: Iterable[Document], n: int = 1) -> BaseRetriever:
    """``retriever``, each of its hits coming with up to ``n`` chunks either side of it in its
    document, taken from ``chunks`` (the split documents as you ingested them) by
    ``metadata["source"]`` and ``metadata["start_index"]``.

    Top-k hits are a document's chunks with gaps between them, which link the entries compiled
    alone; the runs around them link the ones compiled in order (``Config(compile_behind=m)``),
    from each run's ``m + 1``-th chunk on (from its first where the run starts the document). A
    hit without both keys, or whose text is not the ingested chunk's, comes alone; each chunk
    comes once. In a chain: ``with_neighbours(store.as_retriever(), chunks, 2) | document_order |
    format_docs``.
    """
    if not isinstance(retriever, Runnable):
        raise ConfigError(f"retriever must be a LangChain retriever (or a Runnable returning Documents), "
                          f"got {type(retriever).__name__}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(f"n must be how many chunks to add on each side of a hit, an int >= 0, got {n!r}")
    chunks = list(chunks)
    bad = next((i for i, d in enumerate(chunks) if not isinstance(d, Document)), None)
    if bad is not None:
        raise ConfigError(f"chunks[{bad}] is a {type(chunks[bad]).__name__}, not a LangChain Document: pass the "
                          "split documents you added to the vector store")
    return _WithNeighbours(retriever=retriever, around=_runs_around(chunks, n))


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
