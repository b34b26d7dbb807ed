"""Find cached chunks in prompt text by their exact string, and cut the prompt around them.

The frameworks put each retrieved chunk's text in the prompt verbatim, so the primary way to
know which KV to link is to find those strings (retrieval ids only narrow the search).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Match", "find_chunks", "split_prompt"]


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
