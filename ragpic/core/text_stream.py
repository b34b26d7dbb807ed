"""Token ids -> text deltas: stop strings honoured (never emitted), UTF-8 kept whole."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ragpic.core.decode import Sampling

__all__ = ["TextDelta", "held_back", "stop_hit", "stream_text"]


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


@dataclass(slots=True)
class TextDelta:
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length" or "eos" on the last delta


def stream_text(tokenizer, token_iter: Iterator[int], sampling: Sampling) -> Iterator[TextDelta]:
    """Turn ids into text deltas, honouring stop strings without emitting any part of them.

    The whole generated id list is decoded each step (not token by token) so multi-byte
    characters and merges come out right; only the new suffix is emitted.
    """
    ids: list[int] = []
    emitted = 0
    for tok in token_iter:
        ids.append(tok)
        text = tokenizer.decode(ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next byte
            continue
        cut = stop_hit(text, sampling.stop)
        if cut >= 0:
            yield TextDelta(text[emitted:cut], ids.copy(), "stop")
            return
        safe = len(text) - held_back(text, sampling.stop)
        if safe > emitted:
            yield TextDelta(text[emitted:safe], ids.copy())
            emitted = safe
    text = tokenizer.decode(ids, skip_special_tokens=True)
    reason = "length" if len(ids) >= sampling.max_new_tokens else "eos"
    yield TextDelta(text[emitted:], ids.copy(), reason)
