"""What a chain puts in its prompt for a document: the text ingest compiles (docs/FRAMEWORKS.md)."""

from __future__ import annotations

from collections.abc import Callable

from langchain_core.documents import Document

__all__ = ["TextOf", "page_text"]

TextOf = Callable[[Document], str]


def page_text(doc: Document) -> str:
    """The text ``format_docs`` puts in the prompt for ``doc``: its ``page_content``."""
    return doc.page_content
