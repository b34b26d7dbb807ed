"""The text-index row of a stored chunk: its *anchor* and how a prompt slice is confirmed.

Without retrieval hints the engine must find stored chunk texts in a prompt. Scanning every
stored text costs O(store) per prompt, so each chunk is keyed by an anchor: a hash of its
first :data:`ANCHOR` characters (of its whole text when shorter, its length noted). A prompt
is probed at every position where a chunk may start, and each hit confirmed by a digest of
the prompt slice of the chunk's length (see :mod:`ragpic.cache.store.text_match`). Backends
keep these rows in their catalog, beside the chunk's text, written and removed with it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

ANCHOR = 32


def anchor_hash(text: str) -> str:
    """16 hex digits naming an anchor (a chunk's first ``ANCHOR`` chars, or all of a short one)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def text_digest(text: str) -> str:
    """32 hex digits confirming a whole text (a 128-bit hash: collisions are not a concern)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def anchor_of(text: str) -> str:
    return anchor_hash(text[:ANCHOR])


@dataclass(slots=True, frozen=True)
class Posting:
    """One stored chunk under its anchor: its store key, length in characters and digest."""

    key: str
    length: int
    digest: str

    def encode(self) -> str:
        return f"{self.key}|{self.length}|{self.digest}"

    @staticmethod
    def decode(raw: str) -> "Posting":
        key, length, digest = raw.split("|")
        return Posting(key, int(length), digest)


def posting_of(key: str, text: str) -> tuple[str, Posting]:
    """``(anchor, posting)`` of the chunk ``text`` stored under ``key``."""
    return anchor_of(text), Posting(key, len(text), text_digest(text))
