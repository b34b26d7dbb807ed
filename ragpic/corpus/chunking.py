"""Documents -> chunk texts, exactly as the framework hooks will later find them in prompts.

A chunk's store key is its exact prompt text (ARCHITECTURE §4.4), so ingest must cut a corpus
the way the application does, or nothing it compiled is ever matched:

- ``llamaindex`` (the default): ``SentenceSplitter(chunk_size=chunk_tokens, chunk_overlap=0)``
  counting the model's own tokens, each node's text as LlamaIndex's synthesizers put it in a
  prompt (:func:`ragpic.retriever_hooks.llamaindex.node_text`: metadata lines, a blank line, the
  text). It is the splitter ``ragpic demo`` ingests with, so a folder compiled by ``ragpic
  compile`` is found by the demo's index of the same folder.
- ``langchain``: ``RecursiveCharacterTextSplitter.from_huggingface_tokenizer`` with the same
  size, each chunk's ``page_content`` (what ``format_docs`` joins).
- ``none``: each document is one chunk, as given (a corpus chunked already).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ragpic.corpus.sources import Doc
from ragpic.errors import UsageError

__all__ = ["CHUNKERS", "Chunker", "check_chunking", "llamaindex_splitter", "make_chunker"]

Chunker = Callable[[Doc], list[str]]
CHUNKERS = ("llamaindex", "langchain", "none")


def _count(tokenizer: Any) -> Callable[[str], list[int]]:
    return lambda t: tokenizer(t, add_special_tokens=False)["input_ids"]


def llamaindex_splitter(tokenizer: Any, chunk_tokens: int) -> Any:
    """The ``SentenceSplitter`` both ``ragpic compile`` and ``ragpic demo`` cut documents with:
    ``chunk_tokens`` of the model's own tokens, no overlap."""
    from llama_index.core.node_parser import SentenceSplitter

    return SentenceSplitter(chunk_size=chunk_tokens, chunk_overlap=0, tokenizer=_count(tokenizer))


def _llamaindex(tokenizer: Any, chunk_tokens: int) -> Chunker:
    from llama_index.core import Document
    from llama_index.core.schema import BaseNode

    from ragpic.retriever_hooks.llamaindex.nodes import node_texts

    splitter = llamaindex_splitter(tokenizer, chunk_tokens)

    def chunk(doc: Doc) -> list[str]:
        source = doc.original if isinstance(doc.original, BaseNode) else \
            Document(text=doc.text, id_=doc.name, metadata=dict(doc.metadata))
        return node_texts(splitter.get_nodes_from_documents([source]))

    return chunk


def _langchain(tokenizer: Any, chunk_tokens: int) -> Chunker:
    from langchain_core.documents import Document
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    from ragpic.retriever_hooks.langchain.documents import page_text

    splitter = RecursiveCharacterTextSplitter.from_huggingface_tokenizer(
        tokenizer, chunk_size=chunk_tokens, chunk_overlap=0)

    def chunk(doc: Doc) -> list[str]:
        source = doc.original if isinstance(doc.original, Document) else \
            Document(page_content=doc.text, metadata=dict(doc.metadata))
        return [t for t in (page_text(d) for d in splitter.split_documents([source])) if t.strip()]

    return chunk


def _whole(tokenizer: Any, chunk_tokens: int) -> Chunker:
    return lambda doc: [doc.text] if doc.text.strip() else []


def check_chunking(name: str, chunk_tokens: int) -> None:
    """Raise :class:`UsageError` unless ``name`` is one of :data:`CHUNKERS` and ``chunk_tokens``
    a whole number >= 16 (checked where a job is made, before any model loads)."""
    if name not in CHUNKERS:
        raise UsageError(f"chunker must be one of {', '.join(CHUNKERS)}, got {name!r}")
    if not isinstance(chunk_tokens, int) or chunk_tokens < 16:
        raise UsageError(f"chunk_tokens must be >= 16, got {chunk_tokens!r}")


def make_chunker(name: str, tokenizer: Any, chunk_tokens: int) -> Chunker:
    """The chunker ``name`` (one of :data:`CHUNKERS`) counting ``tokenizer``'s tokens."""
    check_chunking(name, chunk_tokens)
    builders = {"llamaindex": _llamaindex, "langchain": _langchain, "none": _whole}
    return builders[name](tokenizer, chunk_tokens)
