"""Retrieved node texts -> the LLM of the same query, through a root-dispatcher event handler
and a ``ContextVar`` (sync, async and streaming queries alike)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.retrieval import RetrievalEndEvent
from llama_index.core.schema import BaseNode, NodeWithScore

from ragpic.retriever_hooks.llamaindex.nodes import node_text, node_texts

__all__ = ["current_hints", "hints_for", "install_retrieval_hints", "retrieval_hints"]



@dataclass(frozen=True, slots=True)
class _Hints:
    query: str | None  # the retrieval's query string; None when set by hand
    texts: tuple[str, ...]


_HINTS: ContextVar[_Hints | None] = ContextVar("ragpic_llamaindex_hints", default=None)


def current_hints() -> tuple[str, ...] | None:
    """The node texts of the latest retrieval in this context (thread / asyncio task), if any."""
    h = _HINTS.get()
    return h.texts if h is not None else None


def hints_for(prompt: str) -> tuple[str, ...] | None:
    """The hints that belong to ``prompt``: those of the latest retrieval in this context if
    its query string appears in the prompt (every LlamaIndex QA/refine template contains
    it), else ``None`` (stale hints of an earlier query; the engine then searches the store's
    catalog). Hints set with :func:`retrieval_hints` always apply."""
    h = _HINTS.get()
    if h is None or (h.query and h.query not in prompt):
        return None
    return h.texts


@contextlib.contextmanager
def retrieval_hints(nodes_or_texts: Iterable[BaseNode | NodeWithScore | str]) -> Iterator[None]:
    """Set the hints by hand for the calls inside the ``with`` block (custom pipelines)."""
    texts = tuple(x.strip() if isinstance(x, str) else node_text(x) for x in nodes_or_texts)
    token = _HINTS.set(_Hints(None, tuple(dict.fromkeys(t for t in texts if t))))
    try:
        yield
    finally:
        _HINTS.reset(token)


def _query_str(q: Any) -> str:
    return q if isinstance(q, str) else (getattr(q, "query_str", "") or "")


class _RetrievalHintHandler(BaseEventHandler):
    """Root-dispatcher handler: retrieved node texts -> ``_HINTS`` of the current context.

    Not cleared when the query ends: a streaming response calls the LLM lazily, when the
    caller iterates it, after ``QueryEndEvent``. :func:`hints_for` drops stale hints instead.
    """

    @classmethod
    def class_name(cls) -> str:
        return "RagPicRetrievalHintHandler"

    def handle(self, event: Any, **kwargs: Any) -> None:
        if isinstance(event, RetrievalEndEvent):
            texts = tuple(dict.fromkeys(node_texts(event.nodes)))
            _HINTS.set(_Hints(_query_str(event.str_or_query_bundle), texts))


_install_lock = threading.Lock()  # two LLMs created at once must not both add a handler


def install_retrieval_hints(dispatcher: Any = None) -> None:
    """Add the hint handler to ``dispatcher`` (LlamaIndex's root dispatcher by default), unless
    it already has one: idempotent, so any number of LLMs leave exactly one handler.

    :class:`~ragpic.llm.llamaindex.RagPicLLM` calls this when created (documented there), so a
    plain ``index.as_query_engine(llm=RagPicLLM(engine))`` passes hints without anything else.
    The handler only records retrieved node texts in a context variable; it changes nothing
    LlamaIndex does.
    """
    dispatcher = dispatcher or get_dispatcher()
    with _install_lock:
        if not any(isinstance(h, _RetrievalHintHandler) for h in dispatcher.event_handlers):
            dispatcher.add_event_handler(_RetrievalHintHandler())
