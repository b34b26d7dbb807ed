"""What the engine hands back: a :class:`Generation` (text + how it was made) and its stream."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from ragpic.core.text_stream import TextDelta

__all__ = ["Generation", "GenerationStream", "MatchStats"]


@dataclass(slots=True)
class MatchStats:
    """How the prompt's chunks were found and where their KV came from.

    Attributes:
        matched: chunk occurrences found in the prompt (a repeated chunk counts twice).
        loaded: distinct chunks whose KV came from the store.
        compiled: distinct chunks compiled on the fly (not stored yet).
        hinted: retrieval hints given for the call (0: the store's catalog was searched).
    """

    matched: int = 0
    loaded: int = 0
    compiled: int = 0
    hinted: int = 0


@dataclass(slots=True)
class Generation:
    """One answer and how it was produced.

    ``ttft_s`` runs from the call to the first generated token: segmenting, loading KV,
    compiling misses, linking and picking the token. ``link_s`` is the link forward alone.
    ``recomputed_tokens`` of ``prompt_tokens`` went through the model at link; the rest
    came from compiled KV.
    """

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    method: str = ""
    ttft_s: float = 0.0
    link_s: float = 0.0
    prompt_tokens: int = 0
    recomputed_tokens: int = 0
    chunks_matched: int = 0
    chunks_loaded: int = 0
    chunks_compiled: int = 0


class GenerationStream:
    """Iterate for text deltas; ``result`` holds the whole :class:`Generation` once done."""

    def __init__(self, deltas: Iterator[TextDelta], result: Generation):
        self._deltas = deltas
        self.result = result

    def __iter__(self) -> Iterator[str]:
        for d in self._deltas:
            self.result.text += d.text
            self.result.token_ids = d.token_ids
            if d.finish_reason:
                self.result.finish_reason = d.finish_reason
            if d.text:
                yield d.text
