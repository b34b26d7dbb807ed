"""What the engine hands back: a :class:`Generation` (text + how it was made) and its stream."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field


__all__ = ["Generation", "GenerationStream", "MatchStats"]


@dataclass(slots=True)
class MatchStats:
    """How the prompt's chunks were found and where their KV came from.

    Attributes:
        matched: chunk occurrences found in the prompt (a repeated chunk counts twice).
        loaded: distinct chunks whose KV came from the store.
        compiled: distinct chunks compiled on the fly (not stored yet).
        hinted: distinct retrieval hints given for the call (0: the store's catalog was searched).
        hints_found: how many of them were found in the prompt text (fewer: a warning is logged).
        compiled_tokens: prompt tokens inside chunks compiled during this call.
        fresh: indices of the segments whose KV was compiled during this call.
        behind: chunk occurrences linked from an entry compiled behind the chunks before them
            in the prompt (docs/ARCHITECTURE.md §1.3).
    """

    matched: int = 0
    loaded: int = 0
    compiled: int = 0
    hinted: int = 0
    hints_found: int = 0
    compiled_tokens: int = 0
    fresh: set[int] = field(default_factory=set)
    behind: int = 0


@dataclass(slots=True)
class Generation:
    """One answer and how it was produced.

    Every count is computed in one place, :func:`ragpic.engine.request.token_counts`, and means
    the same from ``RagPic.generate``, the framework classes and ``ragpic serve``
    (docs/ARCHITECTURE.md §1.2). ``ttft_s`` runs from the call (the server: the
    request's arrival) to the first generated token: segmenting, loading KV, compiling misses,
    linking and picking the token. ``link_s`` is the link forward alone. ``recomputed_tokens``
    of ``prompt_tokens`` are the distinct positions the link computed; ``link_rows`` the rows
    it forwarded (its cost: ``qr`` forwards a row of both passes twice). ``cached_tokens``: the
    positions inside chunks read from the store whose compiled KV the link kept (what
    OpenAI-style usage calls cached tokens: their prefill was skipped); ``compiled_tokens``:
    tokens of chunks compiled on the fly for this call. So ``cached + recomputed <= prompt``,
    the rest being chunk tokens compiled now and not recomputed. ``hints`` / ``hints_found``:
    retrieval hints given / found in the prompt text. ``chunks_behind``: chunk occurrences
    linked from an entry compiled behind the chunks before them (docs/ARCHITECTURE.md §1.3).
    """

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    method: str = ""
    ttft_s: float = 0.0
    link_s: float = 0.0
    prompt_tokens: int = 0
    recomputed_tokens: int = 0
    link_rows: int = 0
    chunks_matched: int = 0
    chunks_loaded: int = 0
    chunks_compiled: int = 0
    chunks_behind: int = 0
    cached_tokens: int = 0
    compiled_tokens: int = 0
    hints: int = 0
    hints_found: int = 0
    model: str = ""

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)

    def usage(self) -> dict:
        """OpenAI-style usage: ``prompt_tokens``, ``completion_tokens``, ``total_tokens`` and
        ``prompt_tokens_details.cached_tokens``."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


class GenerationStream:
    """Iterate for text deltas; ``result`` holds the whole :class:`Generation` once done."""

    def __init__(self, deltas: Iterator[str], result: Generation):
        self._deltas = deltas
        self.result = result

    def __iter__(self) -> Iterator[str]:
        for text in self._deltas:
            if text:
                yield text
