"""Token ids -> text deltas, one id pushed at a time: the one detokenizer (engine and server).

Decoding is incremental over a bounded window of ids (the scheme of vLLM's and HF
``TextStreamer``'s incremental detokenization), so each id costs the same whatever the answer's
length: decoding the whole id list at every id made a long answer quadratic. The text is the
whole list's ``decode(ids, skip_special_tokens=True)``, cut into deltas: multi-byte characters
and merges come out right, an incomplete UTF-8 tail waits for the next id, no part of a stop
string is ever emitted, and text that might begin one is held back until it cannot. Ids are
never re-tokenized (DESIGN §3).
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

    The window: ``ids[prefix:read]`` are the ids of the last piece of text taken in (context: a
    token's text can depend on the one before it, e.g. a SentencePiece leading space), and
    ``ids[read:]`` those not taken in yet. Each push decodes ``ids[prefix:]`` and
    ``ids[prefix:read]``; the first's text beyond the second's is new. While it ends in
    ``"\\ufffd"`` (an incomplete UTF-8 sequence) the new ids wait for the next; once text is taken
    in, ``prefix`` moves to ``read`` and ``read`` to the end. So the window holds a few ids whatever
    the answer's length; it grows only over a run of ids that decode to nothing (skipped special
    tokens) or to an incomplete character. This assumes decoding is append-only (the text of
    ``ids + more`` starts with the text of ``ids``): true of byte-level BPE and SentencePiece
    tokenizers with ``clean_up_tokenization_spaces`` off.

    Text taken in but not emitted (it might begin a stop string) waits in a pending string;
    the stop-string search runs over it behind a tail of the emitted text as long as the longest
    stop string less one, so a match or a held-back prefix is found exactly as over the whole
    text (emitted text never holds the start of a match, which would have been held back).

    Attributes:
        ids: every id pushed so far (``list[int]``).
    """

    def __init__(self, tokenizer, stops: Sequence[str] = ()):
        self._tok, self._stops = tokenizer, tuple(stops)
        self.ids: list[int] = []
        self._prefix = self._read = 0  # the window's offsets into ids (see the class docstring)
        self._pending = ""  # text taken in, not emitted yet (held back)
        self._tail = ""  # the end of the emitted text, for stop strings that would span it
        self._keep = max((len(s) for s in self._stops), default=1) - 1

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def _take(self) -> str | None:
        """The text of the ids not taken in yet, or None while they add nothing complete."""
        before = self._decode(self.ids[self._prefix:self._read])
        text = self._decode(self.ids[self._prefix:])
        if len(text) <= len(before) or text.endswith("\ufffd"):
            return None
        self._prefix, self._read = self._read, len(self.ids)
        return text[len(before):]

    def _emit(self, out: str) -> str:
        self._tail = (self._tail + out)[-self._keep:] if self._keep else ""
        return out

    def push(self, token: int) -> tuple[str, bool]:
        """``(text to emit now, stopped)``; after ``stopped`` push no more."""
        self.ids.append(int(token))
        new = self._take()
        if new is None:
            return "", False
        text, start = self._tail + self._pending + new, len(self._tail)
        cut = stop_hit(text, self._stops)
        if cut >= 0:
            self._pending = ""
            return self._emit(text[start:max(cut, start)]), True
        safe = len(text) - held_back(text, self._stops)
        if safe <= start:
            self._pending = text[start:]
            return "", False
        self._pending = text[safe:]
        return self._emit(text[start:safe]), False

    def flush(self) -> str:
        """What is still held back, at the end of a generation that did not stop on a string."""
        if not self.ids:
            return ""
        before = self._decode(self.ids[self._prefix:self._read])
        rest = self._decode(self.ids[self._prefix:])[len(before):]  # may end incomplete
        self._prefix, self._read = self._read, len(self.ids)
        out, self._pending = self._pending + rest, ""
        return self._emit(out)
