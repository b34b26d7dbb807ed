"""Ordered prompt segments (uncached text and cached chunks) and their token ids.

A prompt's token sequence is the concatenation of its separately tokenized pieces. Each
cached chunk keeps exactly the ids it was compiled with; the text between chunks (the
template, separators, the question) is tokenized on its own. Text is never re-tokenized
from decoded ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ragpic.core.kv import ChunkKV

__all__ = ["Segment", "chunk_segment", "concat_ids", "segment_starts", "text_segment"]


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
