"""Retrieval hints: the documents a chain run retrieved, handed to that run's ragpic LLM."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler

from ragpic.retriever_hooks.langchain.documents import TextOf, page_text

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

__all__ = ["RetrievalHints", "messages_key", "prompt_key"]


def prompt_key(prompt: str) -> str:
    """Key of a completion prompt, as both the handler and the LLM see it."""
    return hashlib.blake2b(prompt.encode(), digest_size=16).hexdigest()


def messages_key(messages: Sequence[BaseMessage]) -> str:
    """Key of a chat prompt (roles and text of every message)."""
    return prompt_key("\x1e".join(f"{m.type}\x1f{m.text}" for m in messages))


class RetrievalHints(BaseCallbackHandler):
    """Callback handler: documents retrieved in a chain run -> hints for that run's ragpic LLM.

    Every run's root is found from its parent (start events arrive parent first); retrieved
    texts are filed under the root, and each LLM start files its prompt under its root too, so
    the LLM looks its hints up by prompt (LangChain does not give a chat model's ``_stream``
    its run id). A root's entries are dropped when it ends; at most ``max_roots`` are kept.

    Args:
        text_of: document -> the exact text the chain puts in the prompt.
        max_roots: bound on concurrently remembered root runs (oldest dropped first).
    """

    run_inline = True  # record before the next step starts, also under the async manager
    raise_error = False

    def __init__(self, text_of: TextOf = page_text, max_roots: int = 1024):
        self.text_of = text_of
        self.max_roots = max_roots
        self._lock = threading.Lock()
        self._root_of: dict[UUID, UUID] = {}
        self._tree: OrderedDict[UUID, list[UUID]] = OrderedDict()  # root -> its runs
        self._docs: dict[UUID, list[str]] = {}  # root -> retrieved texts, in order
        self._prompts: dict[str, UUID] = {}  # prompt key -> root of the LLM run

    # -- bookkeeping ---------------------------------------------------------------------------
    def _note(self, run_id: UUID, parent_run_id: UUID | None) -> UUID:
        with self._lock:
            root = self._root_of.get(parent_run_id, parent_run_id) if parent_run_id else run_id
            self._root_of[run_id] = root
            if root not in self._tree:
                self._tree[root] = []
                while len(self._tree) > self.max_roots:
                    self._forget_locked(next(iter(self._tree)))
            self._tree[root].append(run_id)
            return root

    def _forget_locked(self, root: UUID) -> None:
        for r in self._tree.pop(root, ()):
            self._root_of.pop(r, None)
        self._docs.pop(root, None)
        for k in [k for k, v in self._prompts.items() if v == root]:
            del self._prompts[k]

    def _end(self, run_id: UUID, parent_run_id: UUID | None) -> None:
        if parent_run_id is None:
            with self._lock:
                self._forget_locked(run_id)

    # -- events --------------------------------------------------------------------------------
    def on_chain_start(self, serialized, inputs, *, run_id: UUID, parent_run_id: UUID | None = None,
                       **kwargs: Any) -> None:
        self._note(run_id, parent_run_id)

    def on_retriever_start(self, serialized, query, *, run_id: UUID, parent_run_id: UUID | None = None,
                           **kwargs: Any) -> None:
        self._note(run_id, parent_run_id)

    def on_retriever_end(self, documents, *, run_id: UUID, parent_run_id: UUID | None = None,
                         **kwargs: Any) -> None:
        if parent_run_id is None:  # a retriever called alone: no LLM will follow in this run
            return
        with self._lock:
            root = self._root_of.get(run_id)
        if root is None:
            root = self._note(run_id, parent_run_id)
        texts = [self.text_of(d) for d in documents]
        with self._lock:
            if root in self._tree:
                self._docs.setdefault(root, []).extend(t for t in texts if t.strip())

    def on_llm_start(self, serialized, prompts, *, run_id: UUID, parent_run_id: UUID | None = None,
                     **kwargs: Any) -> None:
        root = self._note(run_id, parent_run_id)
        with self._lock:
            for p in prompts:
                self._prompts[prompt_key(p)] = root

    def on_chat_model_start(self, serialized, messages, *, run_id: UUID,
                            parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        root = self._note(run_id, parent_run_id)
        with self._lock:
            for msgs in messages:
                self._prompts[messages_key(msgs)] = root

    def on_chain_end(self, outputs, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._end(run_id, parent_run_id)

    def on_chain_error(self, error, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._end(run_id, parent_run_id)

    def on_llm_end(self, response, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._end(run_id, parent_run_id)

    def on_llm_error(self, error, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._end(run_id, parent_run_id)

    # -- lookup --------------------------------------------------------------------------------
    def texts_for(self, key: str) -> list[str]:
        """Texts retrieved in the root run whose LLM was started with prompt ``key``."""
        with self._lock:
            root = self._prompts.get(key)
            return list(dict.fromkeys(self._docs.get(root, ()))) if root is not None else []

    def __len__(self) -> int:
        with self._lock:
            return len(self._tree)
