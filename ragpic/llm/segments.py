"""Prompt text -> ordered segments (uncached text and cached chunks) -> token ids.

A prompt's token sequence is the concatenation of its separately tokenized pieces. Each
cached chunk keeps exactly the ids it was compiled with; the text between chunks (the
template, separators, the question) is tokenized on its own. Text is never re-tokenized
from decoded ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from .kv import ChunkKV


@dataclass(slots=True, frozen=True)
class Segment:
    """One piece of a prompt.

    Attributes:
        token_ids: ``(T,)`` int64 ids on the CPU.
        kv: the compiled KV when this piece is a cached chunk, else ``None`` (computed at link).
        text: the piece's text, when known (for reports and hints).
    """

    token_ids: torch.Tensor
    kv: ChunkKV | None = None
    text: str | None = None

    @property
    def is_chunk(self) -> bool:
        return self.kv is not None

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.numel())


def chunk_segment(kv: ChunkKV, text: str | None = None) -> Segment:
    return Segment(token_ids=kv.token_ids.detach().to("cpu", torch.long), kv=kv, text=text)


def text_segment(tokenizer, text: str) -> Segment:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return Segment(token_ids=torch.tensor(ids, dtype=torch.long), text=text)


def concat_ids(segments: Sequence[Segment]) -> torch.Tensor:
    """``(N,)`` int64: the whole prompt's ids, in order."""
    return torch.cat([s.token_ids for s in segments]) if segments else torch.zeros(0, dtype=torch.long)


def segment_starts(segments: Sequence[Segment]) -> list[int]:
    """Global position of each segment's first token."""
    starts, pos = [], 0
    for s in segments:
        starts.append(pos)
        pos += s.num_tokens
    return starts


@dataclass(slots=True, frozen=True)
class Match:
    start: int
    end: int
    text: str


_DIRECT_SEARCH_LIMIT = 64
_ANCHOR = 32


def find_chunks(prompt: str, candidates: Iterable[str]) -> list[Match]:
    """Non-overlapping occurrences of candidate texts in ``prompt``, left to right.

    Where two candidates overlap, the earlier one wins, then the longer. A chunk that
    appears twice matches twice. With few candidates (the retrieval hints) each is looked up
    with ``str.find``; with a large catalog, candidates are indexed by their first 32
    characters and the prompt is scanned once (candidates shorter than that are not worth a
    cache lookup and are simply computed).
    """
    cands = sorted({c for c in candidates if c}, key=len, reverse=True)
    found: list[Match] = []
    if len(cands) <= _DIRECT_SEARCH_LIMIT:
        for c in cands:
            i = prompt.find(c)
            while i >= 0:
                found.append(Match(i, i + len(c), c))
                i = prompt.find(c, i + 1)
    else:
        by_anchor: dict[str, list[str]] = {}
        for c in cands:
            if len(c) >= _ANCHOR:
                by_anchor.setdefault(c[:_ANCHOR], []).append(c)
        for i in range(len(prompt) - _ANCHOR + 1):
            for c in by_anchor.get(prompt[i:i + _ANCHOR], ()):
                if prompt.startswith(c, i):
                    found.append(Match(i, i + len(c), c))
    found.sort(key=lambda m: (m.start, -(m.end - m.start)))
    kept: list[Match] = []
    for m in found:
        if not kept or m.start >= kept[-1].end:
            kept.append(m)
    return kept


def split_prompt(prompt: str, matches: Sequence[Match]) -> list[tuple[str, bool]]:
    """``[(text, is_chunk), ...]`` covering ``prompt`` exactly, empty pieces dropped."""
    pieces, pos = [], 0
    for m in matches:
        if m.start > pos:
            pieces.append((prompt[pos:m.start], False))
        pieces.append((m.text, True))
        pos = m.end
    if pos < len(prompt):
        pieces.append((prompt[pos:], False))
    return pieces
