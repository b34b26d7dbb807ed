"""Prompts made from token ids, for the evaluations (``ragpic eval``, ``eval needle``/``ruler``, ``bench``).

An evaluation compiles its chunks from ids it cut itself (no store: every method must link the
same tokens), builds the prompt from them, and runs each method through the engine's own
:class:`~ragpic.engine.request.LinkedRequest`; this module is the rest of what it needs from the
core, so the evaluations import no core module but its types.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ragpic.core.compile import document_contexts
from ragpic.core.decode import Sampling
from ragpic.core.kv import ChunkKV
from ragpic.core.link import linker_for
from ragpic.core.methods import Method
from ragpic.core.model import LoadedModel
from ragpic.core.ops.linked_cache import SlabPool
from ragpic.core.segments import Segment, chunk_segment, concat_ids, text_segment
from ragpic.engine.prefix import PrefixCache
from ragpic.engine.request import LinkedRequest

__all__ = ["document_contexts", "layer_rows", "link_only", "new_pool", "new_prefixes", "prompt_ids", "prompt_segments", "request"]


def prompt_segments(tokenizer, prefix: str, kvs: Sequence[ChunkKV], suffix: str | Sequence[int],
                    glue: str | None = None) -> list[Segment]:
    """prefix text, chunk, glue, chunk, ..., suffix (text, or ids as they are); empty texts dropped."""
    segs = [text_segment(tokenizer, prefix)] if prefix else []
    for i, kv in enumerate(kvs):
        if i and glue:
            segs.append(text_segment(tokenizer, glue))
        segs.append(chunk_segment(kv))
    if isinstance(suffix, str):
        if suffix:
            segs.append(text_segment(tokenizer, suffix))
    elif len(suffix):
        segs.append(Segment(torch.tensor(list(suffix), dtype=torch.long)))
    return segs


def prompt_ids(segments: Sequence[Segment]) -> list[int]:
    """The whole prompt's token ids, in order (what a peer engine prefills)."""
    return concat_ids(segments).tolist()


def layer_rows(segments: Sequence[Segment], method: Method, num_layers: int) -> list[list[tuple[int, float]]]:
    """Per forward pass, per layer, ``(rows, sum of their position + 1)`` a link of ``method``
    computes (:meth:`ragpic.core.link.Linker.layer_rows`): what its FLOPs are counted from."""
    return linker_for(method).layer_rows(segments, num_layers)


def new_prefixes(lm: LoadedModel, enabled: bool = True) -> PrefixCache | None:
    """A prefix cache as the engine's (``Config.prefix_cache_tokens``' default), or None when not ``enabled``."""
    return PrefixCache(lm.fingerprint) if enabled else None


def new_pool() -> SlabPool:
    """Linked-cache memory reused from one link to the next (as the engine's own)."""
    return SlabPool()


def request(lm: LoadedModel, segments: Sequence[Segment], method: Method, max_new_tokens: int, *,
            extra_rows: int = 0, pool: SlabPool | None = None, prefixes: PrefixCache | None = None) -> LinkedRequest:
    """A greedy :class:`LinkedRequest` of ``segments`` (every chunk compiled ahead, none from a
    store; the leading text from ``prefixes`` when it holds it, as the engine's)."""
    return LinkedRequest(lm, segments, method, Sampling(max_new_tokens=max_new_tokens), extra_rows=extra_rows,
                         pool=pool, prefixes=prefixes)


def link_only(lm: LoadedModel, segments: Sequence[Segment], method: Method,
              pool: SlabPool | None = None) -> LinkedRequest:
    """``segments`` linked with ``method`` and nothing decoded (bench: link time and memory)."""
    return request(lm, segments, method, 1, pool=pool).link()
