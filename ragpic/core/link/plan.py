"""What every link starts from: the :class:`Linker` interface, the recompute mask, the checks,
and the cache with the cached rows written (docs/ARCHITECTURE.md §4.2).

A link method is a :class:`Linker`: it says which prompt rows it recomputes for given
segments (:meth:`Linker.recompute`), whether it can run in pieces (``pieces_ok``) and which
compile recipe its chunks need (``recipe``). The base class is the rule of the *rows* family
(:mod:`ragpic.core.link.rows`): recompute every uncached row, the first ``k`` rows of every
chunk that does not start at position 0, and the last row; ``every_row`` (``full``) recomputes
all of them and reads no cached KV. Methods that choose their rows while they run
(:mod:`~ragpic.core.link.cacheblend`, :mod:`~ragpic.core.link.query_guided`) run whole
(:meth:`Linker.run_whole`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ragpic.core.kv import device_kv, rotate_keys
from ragpic.core.compile_recipe import links_as
from ragpic.core.methods import Method
from ragpic.core.model import LoadedModel
from ragpic.core.ops.linked_cache import LinkedCache, SlabPool
from ragpic.core.segments import Segment, segment_starts
from ragpic.errors import ContextOverflowError, LinkError

__all__ = ["LinkResult", "Linker", "check_segments", "fill_cached_rows", "new_cache", "synchronize"]


@dataclass(slots=True)
class LinkResult:
    """What link hands to decode.

    Attributes:
        logits: ``(V,)`` fp32 logits of the last prompt token.
        cache: KV of all ``num_tokens`` prompt rows, with ``extra_capacity`` rows free.
        recomputed: how many prompt rows went through the model at link (``qr``: both passes
            counted, so a row recomputed twice counts twice): the link's cost.
        seconds: wall time of the link (device-synchronised).
        rows: ``(num_tokens,)`` bool on the CPU, the prompt positions whose KV the link wrote
            fresh (every other row's KV is the compiled one): what the token counts read.
    """

    logits: torch.Tensor
    cache: LinkedCache
    num_tokens: int
    recomputed: int
    seconds: float
    rows: torch.Tensor | None = None


class Linker:
    """One link method, parsed once (:func:`ragpic.core.link.linker_for`).

    Attributes:
        method: the parsed name (``legolink-16``...).
        every_row: recompute every prompt row, causally, reading no cached KV (``full``).
        pieces_ok: the recomputed rows can run in pieces, in position order
            (:class:`ragpic.core.link.ChunkedLink`); False: :meth:`run_whole` runs the link.
        prefix_ok: the link gains from a leading text linked from kept KV
            (:class:`ragpic.engine.prefix.PrefixCache`): a chunk at position 0 is exact,
            and this method recomputes none of it.
    """

    every_row = False
    pieces_ok = True
    prefix_ok = True

    def __init__(self, method: Method):
        self.method = method

    @property
    def name(self) -> str:
        return self.method.name

    @property
    def recipe(self) -> str:
        """The compile recipe the chunks this method links must have."""
        return self.method.recipe

    def recompute(self, segments: Sequence[Segment]) -> torch.Tensor:
        """``(N,)`` bool on the CPU: the prompt rows this method recomputes (the last one always)."""
        parts = []
        for seg, start in zip(segments, segment_starts(segments)):
            rows = torch.ones(seg.num_tokens, dtype=torch.bool)
            if seg.is_chunk and not self.every_row:
                rows[:] = False
                if start > 0:  # its first k rows were compiled as a sequence start: wrong here
                    rows[: self.method.k] = True
            parts.append(rows)
        mask = torch.cat(parts)
        mask[-1] = True  # its logits start the answer
        return mask

    def layer_rows(self, segments: Sequence[Segment], num_layers: int) -> list[list[tuple[int, float]]]:
        """Per forward pass, per layer, ``(rows, sum of their (position + 1))``: what the link
        computes, for counting its FLOPs (``ragpic bench``)."""
        pos = self.recompute(segments).nonzero().squeeze(1).double() + 1
        return [[(pos.numel(), float(pos.sum()))] * num_layers]

    def run_whole(self, lm: LoadedModel, segments: Sequence[Segment], ids: torch.Tensor, rec: torch.Tensor,
                  cache: LinkedCache) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Run the whole link into ``cache`` (its cached rows written); only when not ``pieces_ok``.

        ``ids``: the prompt's ``(N,)`` host ids; ``rec``: :meth:`recompute`'s mask. Returns the last
        row's ``(V,)`` fp32 logits, the rows recomputed ``(N,)`` (CPU) and the rows forwarded.
        """
        raise NotImplementedError(f"{self.name} runs in pieces")


def check_segments(lm: LoadedModel, segments: Sequence[Segment], linker: Linker, extra_capacity: int) -> int:
    """The prompt's token count, after checking it fits and every chunk's KV suits ``linker``."""
    n = sum(s.num_tokens for s in segments)
    if n == 0:
        raise LinkError("the prompt is empty: nothing to link")
    if n + extra_capacity > lm.context_window:
        raise ContextOverflowError(
            f"the prompt has {n} tokens and asks for up to {extra_capacity} new ones, more than the "
            f"model's context window of {lm.context_window}: retrieve fewer or shorter chunks, or "
            f"lower max_new_tokens. ragpic refuses rather than truncating silently."
        )
    for i, seg in enumerate(segments):
        if seg.kv is None:
            continue
        if seg.kv.fingerprint != lm.fingerprint:
            raise LinkError(
                f"segment {i} holds KV compiled by another model ({seg.kv.fingerprint}, this model is "
                f"{lm.fingerprint}): recompile the chunk with this model"
            )
        if not linker.every_row and links_as(seg.kv.recipe) != linker.recipe:
            raise LinkError(
                f"segment {i} was compiled with recipe {seg.kv.recipe!r} but {linker.name} needs "
                f"{linker.recipe!r}: compile the chunk for this method"
            )
    return n


def synchronize(device: torch.device) -> None:
    """Wait for the device (CUDA): the link's deliberate syncs, so ``seconds`` is its real time."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def new_cache(lm: LoadedModel, capacity: int, pool: SlabPool | None = None) -> LinkedCache:
    """An empty cache for ``capacity`` rows, on a pool's idle memory when one is given."""
    if pool is not None:
        return pool.cache(lm.num_layers, lm.num_kv_heads, lm.head_dim, capacity, dtype=lm.dtype, device=lm.device)
    return LinkedCache(lm.num_layers, lm.num_kv_heads, lm.head_dim, capacity, dtype=lm.dtype, device=lm.device)


def fill_cached_rows(lm: LoadedModel, cache: LinkedCache, segments: Sequence[Segment]) -> None:
    """Write each chunk's KV at its rows, keys re-rotated from compile to global positions.

    A chunk at global start ``s`` compiled at base position ``b`` is rotated by ``s - b``
    (exact: RoPE rotations compose; an int, so no device tensor is made for it); rows of
    text segments are left for the forward to write. Casts to the model dtype happen in the
    writes into the cache, on the device.
    """
    for seg, start in zip(segments, segment_starts(segments)):
        if seg.kv is None:
            continue
        keys, values = device_kv(seg.kv, lm.device)
        key_rows, value_rows = cache.rows(start, seg.kv.num_tokens)
        rotate_keys(keys, int(start - seg.kv.base_position), lm.inv_freq, out=key_rows)
        value_rows.copy_(values)
