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

Document order: with ``Config(compile_behind=m)`` the ingest also compiles each source's chunks
behind the chunks before them, :func:`document_order` (``retriever | document_order |
format_docs``) puts retrieved chunks in their documents' order so a prompt links those entries,
:func:`with_neighbours` wraps the retriever so that each hit comes with the run around it,
and :func:`qa_head` gives the ``Config`` under which they read the prompt's own start
(docs/ARCHITECTURE.md §1.3).
"""

from ragpic.config import kv_folder
from ragpic.retriever_hooks.langchain.documents import page_text
from ragpic.retriever_hooks.langchain.hints import RetrievalHints, messages_key, prompt_key
from ragpic.retriever_hooks.langchain.ingest import add_documents_with_kv, compile_documents, compile_vectorstore
from ragpic.retriever_hooks.langchain.order import document_order, document_runs, qa_head, with_neighbours
from ragpic.retriever_hooks.langchain.persist import faiss_from_documents, load_faiss

__all__ = [
    "RetrievalHints",
    "add_documents_with_kv",
    "compile_documents",
    "compile_vectorstore",
    "document_order",
    "document_runs",
    "faiss_from_documents",
    "kv_folder",
    "load_faiss",
    "messages_key",
    "page_text",
    "prompt_key",
    "qa_head",
    "with_neighbours",
]
