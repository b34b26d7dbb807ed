"""Text building blocks of ``ragpic eval ruler``: key words, filler sentences, and chunks of
an exact token count with needle sentences inside them.

A chunk is a piece of text tokenized on its own, as ragpic tokenizes every cached chunk
(docs/ARCHITECTURE.md §4.5). Chunks are cut at a token boundary, not at a sentence end, so
every chunk but the last holds exactly ``chunk_tokens`` ids; the text after a cut starts
the next chunk, so the chunks laid side by side (no glue) read as one continuous text.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ADJECTIVES", "NOUNS", "Chunk", "FillerStream", "chunk_sizes", "cut_exact", "fill_chunks", "split_exact",
           "token_count", "vocabulary"]

# Keys of the magic-number needles are "adjective-noun" pairs, as RULER's word keys are.
ADJECTIVES = ("amber", "ancient", "brave", "bright", "calm", "clever", "crimson", "curious", "dusty", "eager",
              "faint", "fierce", "gentle", "golden", "hollow", "humble", "icy", "jolly", "lively", "lonely",
              "lucky", "mellow", "misty", "noble", "odd", "pale", "proud", "quiet", "rapid", "rusty", "silent",
              "silver", "sleepy", "smooth", "steady", "sturdy", "swift", "tender", "vivid", "wild")
NOUNS = ("anchor", "badger", "banner", "beacon", "bicycle", "canyon", "castle", "cedar", "comet", "compass",
         "falcon", "fountain", "garden", "glacier", "harbor", "helmet", "island", "jacket", "kettle", "lantern",
         "meadow", "mirror", "orchard", "otter", "pebble", "pepper", "piano", "pillow", "quarry", "river",
         "saddle", "sparrow", "teapot", "thistle", "tunnel", "valley", "violin", "walnut", "window", "zebra")

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def token_count(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def vocabulary(text: str, min_len: int = 4, max_len: int = 10) -> list[str]:
    """Distinct lower-case alphabetic words of ``text`` (sorted), the common-word task's pool."""
    return sorted({w for w in re.findall(r"[a-z]+", text.lower()) if min_len <= len(w) <= max_len})


@dataclass(slots=True, frozen=True)
class Chunk:
    """One cached chunk: its text and the ids ``tokenizer(text)`` gives (no special tokens)."""

    text: str
    ids: tuple[int, ...]


def cut_exact(tokenizer, text: str, n_tokens: int) -> tuple[str, list[int], str]:
    """``(head, head ids, rest)``: the longest prefix of ``text`` that tokenizes, on its own,
    to at most ``n_tokens`` ids (``n_tokens`` whenever ``text`` is longer), and what follows it."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if len(enc["input_ids"]) <= n_tokens:
        return text, list(enc["input_ids"]), ""
    offs, k = enc["offset_mapping"], n_tokens
    while k > 0:
        end = offs[k - 1][1]
        ids = tokenizer(text[:end], add_special_tokens=False)["input_ids"]
        if len(ids) <= n_tokens:  # a merge across the cut can only shorten; step back if it did not fit
            return text[:end], list(ids), text[end:]
        k -= 1
    raise ValueError(f"cannot cut {text[:40]!r} to {n_tokens} tokens")


def split_exact(tokenizer, text: str, n_tokens: int) -> list[Chunk]:
    """``text`` cut into chunks of ``n_tokens`` ids each (the last one shorter)."""
    out = []
    while text:
        head, ids, text = cut_exact(tokenizer, text, n_tokens)
        out.append(Chunk(head, tuple(ids)))
    return out


def chunk_sizes(budget: int, chunk_tokens: int) -> list[int]:
    """Token counts of the chunks filling ``budget`` tokens: full chunks, then the remainder as
    a last chunk when it is at least a quarter chunk (a shorter one is left out)."""
    if budget < 1:
        return []
    full, rest = divmod(budget, chunk_tokens)
    sizes = [chunk_tokens] * full
    if rest >= chunk_tokens // 4 or not sizes:
        sizes.append(rest)
    return sizes


class FillerStream:
    """Haystack sentences in order from a seed-chosen one, cycling; a cut sentence's rest is
    pushed back so the next chunk continues it."""

    def __init__(self, tokenizer, haystack: str, rng: random.Random):
        self.sentences = [s for s in _SENTENCE_END.split(haystack.strip()) if s]
        if not self.sentences:
            raise ValueError("the haystack has no text")
        self.tokenizer, self.pos = tokenizer, rng.randrange(len(self.sentences))
        self.carry = ""
        self._counts: dict[str, int] = {}

    def count(self, text: str) -> int:
        if text not in self._counts:
            self._counts[text] = token_count(self.tokenizer, text)
        return self._counts[text]

    def next(self) -> str:
        if self.carry:
            text, self.carry = self.carry, ""
            return text
        text = self.sentences[self.pos % len(self.sentences)]
        self.pos += 1
        return text


def _fill_one(stream: FillerStream, size: int, needles: Sequence[tuple[float, str]]) -> Chunk:
    """One chunk of ``size`` ids: filler sentences with each needle at its relative depth
    (a sentence boundary), every needle whole inside the chunk."""
    starts_mid_sentence = bool(stream.carry)
    need = sum(stream.count(s) + 1 for _, s in needles)
    if need + 4 > size:
        raise ValueError(f"a chunk of {size} tokens cannot hold its needles ({need} tokens): raise --chunk-tokens")
    pieces, cum = [], [0]
    while cum[-1] + need < size + 8:  # per-sentence counts are close to additive; the cut below is exact
        pieces.append(stream.next())
        cum.append(cum[-1] + stream.count(pieces[-1]) + 1)
    first = 1 if starts_mid_sentence else 0
    # after a carried rest (so its sentence stays whole), else before it when the rest is long
    slots = [i for i in range(first, len(pieces) + 1) if cum[i] + need + 4 <= size] or [0]
    placed: dict[int, list[str]] = {}
    for rel, sentence in sorted(needles):
        placed.setdefault(slots[min(len(slots) - 1, int(rel * len(slots)))], []).append(sentence)
    ordered = []
    for i in range(len(pieces) + 1):
        ordered += placed.get(i, [])
        if i < len(pieces):
            ordered.append(pieces[i])
    text = " ".join(ordered)  # a carried rest keeps its own leading space: the text stays continuous
    while token_count(stream.tokenizer, text) <= size:  # the estimate ran short: more filler after the needles
        text += " " + stream.next()
    head, ids, rest = cut_exact(stream.tokenizer, text, size)
    missing = [s for _, s in needles if s not in head]
    if missing:  # the slots keep needles clear of the cut; reaching here is a bug, not bad input
        raise RuntimeError(f"needle {missing[0]!r} fell outside its chunk")
    stream.carry = rest
    return Chunk(head, tuple(ids))


def fill_chunks(stream: FillerStream, sizes: Sequence[int],
                needles: dict[int, list[tuple[float, str]]]) -> list[Chunk]:
    """Chunks of ``sizes`` ids; ``needles[i]`` lists ``(relative depth, sentence)`` for chunk i."""
    return [_fill_one(stream, size, needles.get(i, [])) for i, size in enumerate(sizes)]
