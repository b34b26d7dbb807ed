"""Token ids -> text deltas, one id pushed at a time: the one detokenizer (engine and server).

The whole id list is decoded each time (multi-byte characters and merges come out right), an
incomplete UTF-8 tail waits for the next id, no part of a stop string is ever emitted, and text
that might begin one is held back until it cannot. Ids are never re-tokenized (DESIGN §3).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["Detokenizer", "held_back", "stop_hit"]


def stop_hit(text: str, stops: Sequence[str]) -> int:
    """Index where the earliest stop string starts in ``text``, or -1."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else -1


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing chars might be the start of a stop string (not safe to emit yet)."""
    hold = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:n]):
                hold = max(hold, n)
                break
    return hold


class Detokenizer:
    """Push ids with :meth:`push`; each returns the new text and whether a stop string hit.

    Attributes:
        ids: every id pushed so far (``list[int]``).
    """

    def __init__(self, tokenizer, stops: Sequence[str] = ()):
        self._tok, self._stops = tokenizer, tuple(stops)
        self.ids: list[int] = []
        self._emitted = 0

    def _decode(self) -> str:
        return self._tok.decode(self.ids, skip_special_tokens=True)

    def push(self, token: int) -> tuple[str, bool]:
        """``(text to emit now, stopped)``; after ``stopped`` push no more."""
        self.ids.append(int(token))
        text = self._decode()
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next byte
            return "", False
        cut = stop_hit(text, self._stops)
        if cut >= 0:
            out, self._emitted = text[self._emitted:cut], len(text)
            return out, True
        safe = len(text) - held_back(text, self._stops)
        if safe <= self._emitted:
            return "", False
        out, self._emitted = text[self._emitted:safe], safe
        return out, False

    def flush(self) -> str:
        """What is still held back, at the end of a generation that did not stop on a string."""
        if not self.ids:
            return ""
        text = self._decode()
        out, self._emitted = text[self._emitted:], len(text)
        return out
