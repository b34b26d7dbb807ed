"""What a compile of chunk texts will do, decided once for ``RagPic.compile`` and the server.

:func:`plan_compile` applies the rules every compile obeys (docs/ARCHITECTURE.md §1.1): a text is
compiled exactly as it will appear in prompts, an empty one is refused, one shorter than
``min_chunk_tokens`` is never cached or matched (skipped, or refused where the caller named it
explicitly: the server's ``/v1/context_cache``), one longer than the model's window (less the
recipe's dummy rows) is refused, a text already stored is not compiled again, and a text given
twice is compiled once. Errors are :class:`ChunkError` with ``index`` = the text's place in the
caller's list, so every entry point names the same chunk the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ragpic.checks import check_texts
from ragpic.core.compile_recipe import recipe_dummies
from ragpic.core.methods import Method
from ragpic.errors import ChunkError

__all__ = ["CompilePlan", "Compiler", "plan_compile"]


class Compiler(Protocol):
    """What a compile plan reads of its engine (:class:`ragpic.RagPic` is one)."""

    config: Any  # ragpic.Config: min_chunk_tokens
    store: Any  # ragpic.cache.ChunkStore: contains_many

    @property
    def context_window(self) -> int: ...

    def count_tokens(self, text: str) -> int: ...

    def chunk_key(self, text: str, method: Method | None = None) -> str: ...


@dataclass(slots=True)
class CompilePlan:
    """A compile, planned.

    Attributes:
        texts: the caller's texts, in order (repeats kept).
        keys: the store key of each (the server's context-cache id).
        tokens: the token count of each.
        stored: whether each was stored before this compile.
        todo: ``(key, text)`` of every distinct text to compile now, in first-seen order.
        todo_at: the place in ``texts`` of each ``todo`` text's first occurrence (how errors name it).
        skipped: indices of texts too short to cache (never compiled; empty when refused).
    """

    texts: list[str]
    keys: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    stored: list[bool] = field(default_factory=list)
    todo: list[tuple[str, str]] = field(default_factory=list)
    todo_at: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)


def plan_compile(engine: Compiler, texts: Sequence[str], method: Method, *, refuse_short: bool = False,
                 tokens: Sequence[int] | None = None) -> CompilePlan:
    """Check ``texts`` and find which of them the store lacks (blocking: the store may be remote).

    ``refuse_short``: a text under ``min_chunk_tokens`` raises instead of being skipped.
    ``tokens``: each text's token count when the caller has counted them already.
    """
    texts = check_texts("texts", texts)
    plan = CompilePlan(list(texts))
    room = engine.context_window - recipe_dummies(method.recipe)
    minimum = engine.config.min_chunk_tokens
    if tokens is None:  # a text given twice is tokenized once
        counted = {t: engine.count_tokens(t) for t in dict.fromkeys(plan.texts) if t.strip()}
        tokens = [counted.get(t, 0) for t in plan.texts]
    for i, (t, n) in enumerate(zip(plan.texts, tokens)):
        if not t.strip():
            raise ChunkError(f"texts[{i}] is empty (or whitespace only) and cannot be compiled: drop it "
                             f"before ingest", i)
        if n > room:
            raise ChunkError(f"texts[{i}] has {n} tokens, more than the model's context window allows ({room}) "
                             f"[text starts {t[:60]!r}]: split it", i)
        if n < minimum:
            if refuse_short:
                raise ChunkError(f"texts[{i}] has {n} tokens, fewer than min_chunk_tokens={minimum}: such short "
                                 f"texts are never cached or matched", i)
            plan.skipped.append(i)
    plan.tokens = list(tokens)
    key_of = {t: engine.chunk_key(t, method) for t in dict.fromkeys(plan.texts)}
    plan.keys = [key_of[t] for t in plan.texts]
    skipped = set(plan.skipped)
    keep = list(dict.fromkeys(t for i, t in enumerate(plan.texts) if i not in skipped))  # distinct, in order
    found = engine.store.contains_many([key_of[t] for t in keep], texts=keep)  # also re-catalogues stored,
    stored = dict(zip(keep, found))                                            # uncatalogued chunks
    plan.stored = [stored.get(t, False) for t in plan.texts]
    plan.todo = [(key_of[t], t) for t in keep if not stored[t]]
    first = {t: i for i, t in reversed(list(enumerate(plan.texts)))}
    plan.todo_at = [first[t] for _, t in plan.todo]
    return plan
