"""Find stored chunks in a prompt at a cost that depends on the prompt, not on the store.

Without retrieval hints (every OpenAI client) the engine must find stored chunk texts in the
prompt. Scanning every stored text costs O(store) per prompt (304 ms and 214 MB of text per
worker at 100k chunks). Instead each catalogued chunk has an anchor row (see
:mod:`ragpic.cache.format.anchors`), kept by its backend with the catalog: a prompt is probed
at every position where a chunk may start (not inside a word:
:func:`ragpic.core.segments.inside_word`, the rule the matcher applies; or where a hit ends),
one hash per position, one batched lookup for all of them, then each hit is confirmed by a
digest of the prompt slice of the chunk's length. The texts returned are exact substrings of
the prompt, so
:func:`~ragpic.core.segments.find_chunks` then applies the usual rules to a handful of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ragpic.cache.format.anchors import ANCHOR, Posting, anchor_hash, text_digest
from ragpic.core.segments import inside_word

SHORTS_REFRESH_S = 5.0

Lookup = Callable[[Sequence[str]], dict[str, list[Posting]]]


class TextMatcher:
    """Candidates of one fingerprint's catalog in a prompt.

    Args:
        lookup: ``anchors -> {anchor: [Posting]}`` (one batched read of the catalog's rows).
        short_lengths: ``() -> {length}`` of catalogued chunks shorter than the anchor; read
            at most every :data:`SHORTS_REFRESH_S` (other workers add short chunks too).
    """

    def __init__(self, lookup: Lookup, short_lengths: Callable[[], set[int]]) -> None:
        self._lookup, self._read_shorts = lookup, short_lengths
        self._shorts: tuple[int, ...] = ()
        self._shorts_at = float("-inf")

    def stale(self) -> None:
        """Re-read the short lengths on the next call (this process just stored chunks)."""
        self._shorts_at = float("-inf")

    def _short_lengths(self) -> tuple[int, ...]:
        if time.monotonic() - self._shorts_at > SHORTS_REFRESH_S:
            self._shorts = tuple(sorted(self._read_shorts()))
            self._shorts_at = time.monotonic()
        return self._shorts

    def candidates(self, prompt: str) -> list[str]:
        """Catalogued chunk texts that occur in ``prompt`` (each an exact slice of it), in no
        order. Raises whatever the catalog's medium raises (the store guards the call).

        Probes every position not inside a word, then, one more batched lookup per round, the
        places inside words where a hit ends: a document cut into pieces at any character and
        linked whole has its next piece start there (:func:`~ragpic.core.segments.find_chunks`)."""
        found: set[str] = set()
        at = [i for i in range(len(prompt)) if not inside_word(prompt, i)]
        probed = set(at)
        while at:
            ends = self._probe(prompt, at, found)
            at = [e for e in ends if e not in probed and inside_word(prompt, e)]
            probed.update(at)
        return list(found)

    def _probe(self, prompt: str, starts: Sequence[int], found: set[str]) -> set[int]:
        """Add to ``found`` the catalogued texts starting at ``starts``; where the hits end."""
        probes: dict[str, list[int]] = {}
        lengths = self._short_lengths()
        n = len(prompt)
        for i in starts:
            if i + ANCHOR <= n:
                probes.setdefault(anchor_hash(prompt[i:i + ANCHOR]), []).append(i)
            for length in lengths:
                if i + length <= n:
                    probes.setdefault(anchor_hash(prompt[i:i + length]), []).append(i)
        ends: set[int] = set()
        for anchor, postings in self._lookup(list(probes)).items():
            for i in probes.get(anchor, ()):
                for p in postings:
                    piece = prompt[i:i + p.length]
                    if len(piece) == p.length and (piece in found or text_digest(piece) == p.digest):
                        found.add(piece)
                        ends.add(i + p.length)
        return ends
