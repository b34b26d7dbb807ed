"""Prompt text -> the chunks in it (by exact text) -> ordered segments with their KV.

The engine's half of the data path's first step: :mod:`ragpic.core.segments` finds strings,
this module decides which strings to look for (hints, else the store's catalog), says when
hints are missing from the prompt, and counts where each chunk's KV came from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from ragpic.checks import check_texts
from ragpic.core.kv import ChunkKV
from ragpic.core.segments import Match, find_chunks, inside_word, split_prompt
from ragpic.core.segments import Segment, chunk_segment, text_segment
from ragpic.engine.generation import MatchStats
from ragpic.engine.prompting import missing_hints_message, partly_in, unlinked_hints_message

__all__ = ["build_segments", "match_chunks"]

log = logging.getLogger("ragpic.engine")


def match_chunks(text: str, hints: Sequence[str] | None, catalog: Callable[[], Iterable[str]],
                 cacheable: Callable[[str], bool]) -> tuple[list[Match], MatchStats]:
    """Chunks found in ``text``: the hints (retrieved texts) when any is there, else every
    text of the store's ``catalog``. Texts that are not ``cacheable`` (too short) never match.

    Hints that reached the prompt changed (in part only: reflowed, re-split, edited) are a
    cache miss nobody would notice, so one warning says how many and where the first one
    stops matching; so are hints there whole that do not match (cut inside a word with no
    neighbouring piece to meet, or overlapping another), with a warning of their own;
    ``stats.hints_found`` counts the hints matched.
    """
    hints = [h for h in dict.fromkeys(check_texts("hints", hints or [])) if cacheable(h)]
    matches = find_chunks(text, hints) if hints else []
    found = {m.text for m in matches}
    changed = [h for h in hints if h not in found and partly_in(text, h)]
    if changed:
        log.warning("%s", missing_hints_message(text, hints, changed))
    if not matches:
        matches = find_chunks(text, catalog())
    unlinked = [h for h in hints if h not in found and h in text and not any(h in m.text for m in matches)]
    if unlinked:
        at = text.find(unlinked[0])
        cut = next((i for i in (at, at + len(unlinked[0])) if inside_word(text, i)), None)
        log.warning("%s", unlinked_hints_message(text, hints, unlinked, cut))
    matches = [m for m in matches if m.text in found or cacheable(m.text)]  # hints were checked above
    return matches, MatchStats(matched=len(matches), hinted=len(hints), hints_found=len(found))


def build_segments(tokenizer, text: str, matches: Sequence[Match], keys: dict[str, str],
                   kvs: dict[str, ChunkKV], from_store: set[str], stats: MatchStats,
                   behind: dict[int, tuple[str, ChunkKV]] | None = None) -> list[Segment]:
    """Pieces of ``text`` in order; a matched piece whose key has KV in ``kvs`` is a chunk
    segment (one compiled now has its tokens counted in ``stats.compiled_tokens`` and its index
    in ``stats.fresh``; the cached count is the link's, :func:`ragpic.engine.request.token_counts`),
    every other piece is text tokenized on its own. ``behind``: match index -> ``(key, KV)`` of
    the matches linked from an entry compiled behind the chunks before them (docs/ARCHITECTURE.md
    §1.3), which take it instead of ``keys``' entry."""
    segs: list[Segment] = []
    behind = behind or {}
    index = -1  # of the match a chunk piece is
    for piece, is_chunk in split_prompt(text, matches):
        index += is_chunk
        if is_chunk and index in behind:
            segs.append(chunk_segment(behind[index][1], piece))
            continue
        kv = kvs.get(keys[piece]) if is_chunk else None
        if kv is None:
            segs.append(text_segment(tokenizer, piece))
            continue
        segs.append(chunk_segment(kv, piece))
        if keys[piece] not in from_store:
            stats.compiled_tokens += kv.num_tokens
            stats.fresh.add(len(segs) - 1)
    return segs
