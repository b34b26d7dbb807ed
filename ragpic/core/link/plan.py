"""Link: turn ordered segments (cached chunks + uncached text) into a ready KV cache.

Every method has the same signature, ``link(lm, segments, method, extra_capacity)``, and
returns the last prompt token's logits plus a :class:`LinkedCache` to decode from:

- ``full``: normal prefill of the concatenated ids (the reference).
- ``naive``: cached KV re-rotated to its global positions; only uncached text recomputed.
- ``legolink-k``: also recompute the first ``k`` tokens of every chunk that does not start
  at position 0 (their attention-sink rows, compiled as a sequence start, are wrong here).
- ``legolink-0``: chunks compiled behind dummy BOS tokens (recipe ``bos4``); like ``naive``.
- ``cacheblend-r``: CacheBlend's dynamic selection (see :mod:`ragpic.core.cacheblend`).
- ``qr-r[-kK]``: ``legolink-K``, then the ``r`` of chunk tokens the question attends to most
  recomputed with the question again (see :mod:`ragpic.core.query_guided`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache

from ragpic.core.cache_fill import fill_cached_rows, new_cache
from ragpic.core.cacheblend import cacheblend_link
from ragpic.core.forward import prefill, recompute_rows
from ragpic.core.methods import Method, parse_method
from ragpic.core.model import LoadedModel
from ragpic.core.ops.device import to_device
from ragpic.core.ops.linked_cache import LinkedCache
from ragpic.core.ops.slab_pool import SlabPool
from ragpic.core.query_guided import qr_link
from ragpic.core.segments import Segment, concat_ids, segment_starts
from ragpic.errors import ContextOverflowError, LinkError

__all__ = ["LinkResult", "check_segments", "link", "recompute_mask", "synchronize"]


@dataclass(slots=True)
class LinkResult:
    """What link hands to decode.

    Attributes:
        logits: ``(V,)`` fp32 logits of the last prompt token.
        cache: KV of all ``num_tokens`` prompt rows, with ``extra_capacity`` rows free.
        recomputed: how many prompt rows went through the model at link (``qr``: both passes
            counted, so a row recomputed twice counts twice).
        seconds: wall time of the link (device-synchronised).
    """

    logits: torch.Tensor
    cache: LinkedCache
    num_tokens: int
    recomputed: int
    seconds: float


def recompute_mask(segments: Sequence[Segment], method: Method) -> torch.Tensor:
    """``(N,)`` bool: which prompt tokens the method recomputes (the last one always)."""
    parts = []
    for seg, start in zip(segments, segment_starts(segments)):
        m = torch.ones(seg.num_tokens, dtype=torch.bool)
        if seg.is_chunk and method.kind != "full":
            m[:] = False
            if method.kind in ("legolink", "qr") and start > 0:  # qr: its first pass
                m[: method.k] = True
        parts.append(m)
    mask = torch.cat(parts)
    mask[-1] = True  # its logits start the answer
    return mask


def check_segments(lm: LoadedModel, segments: Sequence[Segment], method: Method, extra_capacity: int) -> int:
    """The prompt's token count, after checking it fits and every chunk's KV suits ``method``."""
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
        if method.kind != "full" and seg.kv.recipe != method.recipe:
            raise LinkError(
                f"segment {i} was compiled with recipe {seg.kv.recipe!r} but {method.name} needs "
                f"{method.recipe!r}: compile the chunk for this method"
            )
    return n


def synchronize(device: torch.device) -> None:
    """Wait for the device (CUDA): the link's deliberate syncs, so ``seconds`` is its real time."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _full(lm: LoadedModel, ids: torch.Tensor, capacity: int,
          pool: SlabPool | None) -> tuple[torch.Tensor, LinkedCache]:
    n = ids.numel()
    dyn = DynamicCache()
    logits = prefill(lm.model, ids[None], torch.arange(n, device=lm.device)[None], dyn)
    cache = new_cache(lm, capacity, pool)
    for layer, slab_k, slab_v in zip(dyn.layers, cache.key_slab, cache.value_slab):
        slab_k[:, :, :n] = layer.keys
        slab_v[:, :, :n] = layer.values
    return logits[0, -1].float(), cache


def _partial(lm: LoadedModel, ids: torch.Tensor, segments: Sequence[Segment], rec: torch.Tensor,
             capacity: int, pool: SlabPool | None) -> tuple[torch.Tensor, LinkedCache]:
    """``ids`` and ``rec`` are host tensors: only the recomputed rows' ids and positions move."""
    cache = new_cache(lm, capacity, pool)
    fill_cached_rows(lm, cache, segments)
    return recompute_rows(lm, cache, ids, rec.nonzero().squeeze(1), ids.numel()), cache


@torch.inference_mode()
def link(lm: LoadedModel, segments: Sequence[Segment], method: str | Method = "legolink-16",
         *, extra_capacity: int = 0, pool: SlabPool | None = None) -> LinkResult:
    """Build the prompt's KV with ``method`` and return the last token's logits.

    Args:
        segments: the prompt in order; chunk segments carry compiled KV from this model.
        extra_capacity: rows to reserve after the prompt for decoding.
        pool: take the cache's memory from this pool (hand it back with ``pool.release``).
    Raises:
        LinkError: empty prompt, KV of another model, or wrong compile recipe;
            :class:`ContextOverflowError` (a ``LinkError``) when it does not fit.
    """
    method = parse_method(method)
    n = check_segments(lm, segments, method, extra_capacity)
    ids = concat_ids(segments)  # host: link moves only what a kernel reads
    rec = recompute_mask(segments, method)
    synchronize(lm.device)
    t0 = time.perf_counter()
    if method.kind == "full":
        logits, cache = _full(lm, to_device(ids, lm.device), n + extra_capacity, pool)
    elif method.kind == "cacheblend":
        logits, cache, rec = cacheblend_link(lm, to_device(ids, lm.device), segments, rec, method.ratio,
                                             n + extra_capacity, pool)
    elif method.kind == "qr":
        logits, cache, rec, forwarded = qr_link(lm, ids, segments, method, rec, n + extra_capacity, pool)
    else:
        logits, cache = _partial(lm, ids, segments, rec, n + extra_capacity, pool)
    cache.length = n
    synchronize(lm.device)
    return LinkResult(logits=logits, cache=cache, num_tokens=n,
                      recomputed=forwarded if method.kind == "qr" else int(rec.sum()),
                      seconds=time.perf_counter() - t0)
