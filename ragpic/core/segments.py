"""Ordered prompt segments (uncached text and cached chunks) and their token ids, and how
cached chunks are found in prompt text.

A prompt's token sequence is the concatenation of its separately tokenized pieces. Each
cached chunk keeps exactly the ids it was compiled with; the text between chunks (the
template, separators, the question) is tokenized on its own. Text is never re-tokenized
from decoded ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from ragpic.core.kv import ChunkKV

__all__ = ["Match", "Segment", "chunk_segment", "concat_ids", "find_chunks", "inside_word", "on_word_boundaries", "segment_starts",
           "split_prompt", "text_segment"]


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


# ----------------------------------------------------------------------------- chunks in text
# The frameworks put each retrieved chunk's text in the prompt verbatim, so the primary way to
# know which KV to link is to find those strings (retrieval ids only narrow the search).


@dataclass(slots=True, frozen=True)
class Match:
    start: int
    end: int
    text: str


_DIRECT_SEARCH_LIMIT = 64
_ANCHOR = 32


def inside_word(prompt: str, i: int) -> bool:
    """Whether position ``i`` of ``prompt`` lies between two word characters: the one rule for
    where a stored chunk may not start or end (the store's text index probes the same places)."""
    return 0 < i < len(prompt) and prompt[i - 1].isalnum() and prompt[i].isalnum()


def on_word_boundaries(prompt: str, start: int, end: int) -> bool:
    """Whether ``prompt[start:end]`` neither starts nor ends inside a word: a cached "an"
    must not match inside "banana"."""
    return not inside_word(prompt, start) and not inside_word(prompt, end)


def _edges_held(prompt: str, m: Match, starts: set[int], ends: set[int]) -> bool:
    """Whether each end of ``m`` is on a word boundary or meets another occurrence there (one
    that ``ends`` at its start, one that ``starts`` at its end): a document cut into pieces
    at any character and linked whole (docs/ARCHITECTURE.md §1.3) has its pieces meet inside
    words, where together they hold the word whole."""
    return ((not inside_word(prompt, m.start) or m.start in ends)
            and (not inside_word(prompt, m.end) or m.end in starts))


def _occurrences(prompt: str, cands: list[str]) -> list[Match]:
    """Every occurrence of every candidate: ``str.find`` per candidate while there are few,
    else one scan of the prompt with candidates indexed by their first characters (by their
    whole text when shorter than the anchor), so the cost is O(prompt x distinct short lengths)."""
    found: list[Match] = []
    if len(cands) <= _DIRECT_SEARCH_LIMIT:
        for c in cands:
            i = prompt.find(c)
            while i >= 0:
                found.append(Match(i, i + len(c), c))
                i = prompt.find(c, i + 1)
        return found
    by_anchor: dict[str, list[str]] = {}
    short: dict[int, set[str]] = {}
    for c in cands:
        if len(c) >= _ANCHOR:
            by_anchor.setdefault(c[:_ANCHOR], []).append(c)
        else:
            short.setdefault(len(c), set()).add(c)
    for i in range(len(prompt)):
        for c in by_anchor.get(prompt[i:i + _ANCHOR], ()):
            if prompt.startswith(c, i):
                found.append(Match(i, i + len(c), c))
        for n, texts in short.items():
            if prompt[i:i + n] in texts:
                found.append(Match(i, i + n, prompt[i:i + n]))
    return found


def find_chunks(prompt: str, candidates: Iterable[str]) -> list[Match]:
    """Non-overlapping occurrences of candidate texts in ``prompt``, left to right.

    Only occurrences on word boundaries count (see :func:`on_word_boundaries`), or that meet
    another kept occurrence where they start or end inside a word (a document's pieces
    concatenated). Where two candidates overlap, the earlier one wins, then the longer. A
    chunk that appears twice matches twice.
    """
    cands = sorted({c for c in candidates if c}, key=len, reverse=True)
    found = _occurrences(prompt, cands)
    pool = [m for m in found if _edges_held(prompt, m, {x.start for x in found}, {x.end for x in found})]
    pool.sort(key=lambda m: (m.start, -(m.end - m.start)))
    while True:  # a piece whose neighbour lost an overlap loses its neighbour's word too
        kept: list[Match] = []
        for m in pool:
            if not kept or m.start >= kept[-1].end:
                kept.append(m)
        starts, ends = {m.start for m in kept}, {m.end for m in kept}
        dropped = {m for m in kept if not _edges_held(prompt, m, starts, ends)}
        if not dropped:
            return kept
        pool = [m for m in pool if m not in dropped]


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
