"""Find stored chunks in a prompt at a cost that depends on the prompt, not on the store.

Without retrieval hints (every OpenAI client) the engine must find stored chunk texts in the
prompt. Scanning every stored text costs O(store) per prompt (304 ms and 214 MB of text per
worker at 100k chunks). This index instead keys each chunk by an *anchor*: a hash of its
first :data:`ANCHOR` characters (of its whole text when shorter, with its length noted). A
prompt is probed at every position where a chunk may start (word boundaries, the rule of
:func:`ragpic.core.matching.on_word_boundaries`): one hash per position, one batched lookup
for all of them, then each hit is confirmed by a digest of the prompt slice of the chunk's
length. The texts returned are exact substrings of the prompt, so
:func:`~ragpic.core.matching.find_chunks` then applies the usual rules to a handful of them.

Rows live in a table shared through the store's backend (:mod:`.text_index_tables`): Redis
hashes under the store's prefix, a SQLite file beside a folder store, or memory. Each worker
holds no texts, only the few distinct lengths of short chunks. The index is kept as chunks
are stored (the engine adds what ``put_many`` stored); a store indexed for the first time is
filled once from its catalog. A failing table degrades to "no match" (text is computed), never
to a failed query.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ragpic.cache.breaker import Breaker

log = logging.getLogger("ragpic.cache")

ANCHOR = 32
SHORTS_REFRESH_S = 5.0


def anchor_hash(text: str) -> str:
    """16 hex digits naming an anchor (a chunk's first ``ANCHOR`` chars, or all of a short one)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def text_digest(text: str) -> str:
    """32 hex digits confirming a whole text (a 128-bit hash: collisions are not a concern)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


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


def anchor_of(text: str) -> str:
    return anchor_hash(text[:ANCHOR])


def starts(prompt: str) -> list[int]:
    """Positions where a chunk may start: not between two word characters."""
    return [i for i in range(len(prompt)) if i == 0 or not (prompt[i - 1].isalnum() and prompt[i].isalnum())]


class TextIndex:
    """Chunk texts by anchor over a shared table (see :mod:`.text_index_tables`)."""

    def __init__(self, table, spill=None):
        """``spill``: a process-local table (``MemoryTable``) that takes the rows ``table``
        refuses (a full disk, an outage), so this process still finds those chunks; the next
        open refills the shared table from the store's catalog."""
        self.table, self.spill = table, spill
        self._breaker = Breaker()
        self._shorts: tuple[int, ...] = ()
        self._shorts_at = float("-inf")
        self._warned = False

    def _failed(self, what: str, exc: Exception) -> None:
        if not self._warned:  # once: a store outage must not flood the log
            log.warning("chunk text index: %s failed (%s: %s); prompts are matched without it", what,
                        type(exc).__name__, exc)
            self._warned = True

    def add(self, items: Mapping[str, str]) -> None:
        """Index ``key -> text`` (already stored chunks). Idempotent."""
        if not items:
            return
        rows = [(anchor_of(t), Posting(k, len(t), text_digest(t)), t) for k, t in items.items() if t]
        try:
            self.table.add(rows)
        except Exception as exc:
            self._failed("add", exc)
            if self.spill is not None:
                self.spill.add(rows)
        self._shorts_at = float("-inf")

    def remove(self, keys: Sequence[str]) -> None:
        try:
            self.table.remove(list(keys))
        except Exception as exc:
            self._failed("remove", exc)

    def texts_of(self, keys: Sequence[str]) -> dict[str, str]:
        """``key -> text`` of the indexed keys among ``keys``."""
        try:
            return self.table.texts(list(keys))
        except Exception as exc:
            self._failed("texts_of", exc)
            return {}

    def _tables(self) -> list:
        return [self.table] + ([self.spill] if self.spill is not None and self.spill.count() else [])

    def _short_lengths(self) -> tuple[int, ...]:
        if time.monotonic() - self._shorts_at > SHORTS_REFRESH_S:  # other workers add short chunks too
            self._shorts = tuple(sorted(set().union(*(t.short_lengths() for t in self._tables()))))
            self._shorts_at = time.monotonic()
        return self._shorts

    def candidates(self, prompt: str) -> list[str] | None:
        """Stored chunk texts that occur in ``prompt`` (each an exact slice of it), in no order;
        ``None`` when the shared table cannot answer (the caller falls back to the store's own
        catalog, which sits behind the store's breaker and budget). After a failure the table
        is not asked again until a back-off that doubles has passed, so a stalled server costs
        one timeout, not one per query."""
        if not self._breaker.allow("read"):
            return None
        try:
            found = self._candidates(prompt)
        except Exception as exc:
            self._failed("lookup", exc)
            self._breaker.failure("read")
            return None
        self._breaker.success("read")
        return found

    def _candidates(self, prompt: str) -> list[str]:
        probes: dict[str, list[int]] = {}
        lengths = self._short_lengths()
        n = len(prompt)
        for i in starts(prompt):
            if i + ANCHOR <= n:
                probes.setdefault(anchor_hash(prompt[i:i + ANCHOR]), []).append(i)
            for length in lengths:
                if i + length <= n:
                    probes.setdefault(anchor_hash(prompt[i:i + length]), []).append(i)
        found: set[str] = set()
        hits = [item for t in self._tables() for item in t.lookup(list(probes)).items()]
        for anchor, postings in hits:
            for i in probes.get(anchor, ()):
                for p in postings:
                    piece = prompt[i:i + p.length]
                    if len(piece) == p.length and piece not in found and text_digest(piece) == p.digest:
                        found.add(piece)
        return list(found)

    def fill_from(self, catalog: Iterable[tuple[str, str]], batch: int = 2048) -> int:
        """Index every ``(key, text)`` of a catalog (a store indexed for the first time)."""
        rows, count = {}, 0
        for key, text in catalog:
            rows[key] = text
            if len(rows) >= batch:
                self.add(rows)
                count, rows = count + len(rows), {}
        self.add(rows)
        return count + len(rows)
