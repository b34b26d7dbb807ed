"""LlamaIndex hooks: compile node KV at ingest, pass retrieved node texts to the LLM.

What LlamaIndex puts in a prompt for a retrieved node is
``node.get_content(metadata_mode=MetadataMode.LLM).strip()`` (the LLM-visible metadata lines,
a blank line, the text); the default ``compact`` synthesizer joins those with ``"\\n\\n"``
inside the text-QA template. :func:`node_text` is that string, and it is what
:class:`RagPicIngest` and :func:`compile_index` compile, so the engine finds each node
verbatim in the prompt and links its stored KV.

Retrieval hints: :func:`install_retrieval_hints` adds one handler to LlamaIndex's root
instrumentation dispatcher (once per dispatcher, however many LLMs are created). On every ``RetrievalEndEvent`` it stores the retrieved nodes'
texts in a :class:`~contextvars.ContextVar`; :class:`ragpic.llm.llamaindex.RagPicLLM` reads
it when called. Retrieval and synthesis of one query run in the same context (same thread,
or the same asyncio task), so this works for ``query``, ``aquery`` and streaming queries,
and concurrent queries in other threads or tasks never see each other's hints. The LLM
uses them only when the retrieval's query string is in its prompt (so an unrelated call
after a query ignores them). Hints only narrow the search: without them the engine looks
for every stored chunk in the prompt.

Document order: with ``Config(compile_behind=m)`` the ingest also compiles each document's nodes
behind the nodes before them, and :class:`DocumentOrder` (a node postprocessor) puts retrieved
nodes in their documents' order so a prompt links those entries (docs/ARCHITECTURE.md §1.3).

Persistence: :func:`build_faiss_index` / :func:`persist_index` / :func:`load_faiss_index`
keep a FAISS vector index in a folder and the KV store in ``folder/kv``
(:func:`kv_folder`), so a fresh process reloads both and links without compiling.
"""

from ragpic.config import kv_folder
from ragpic.retriever_hooks.llamaindex.hints import (
    current_hints,
    hints_for,
    install_retrieval_hints,
    retrieval_hints,
)
from ragpic.retriever_hooks.llamaindex.ingest import RagPicIngest, compile_index
from ragpic.retriever_hooks.llamaindex.nodes import node_text
from ragpic.retriever_hooks.llamaindex.order import DocumentOrder, qa_head
from ragpic.retriever_hooks.llamaindex.persist import build_faiss_index, load_faiss_index, persist_index

__all__ = [
    "DocumentOrder",
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
    "qa_head",
    "retrieval_hints",
]
