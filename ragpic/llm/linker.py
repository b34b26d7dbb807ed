"""Link: turn ordered segments (cached chunks + uncached text) into a ready KV cache.

Every method has the same signature, ``link(lm, segments, method, extra_capacity)``, and
returns the last prompt token's logits plus a :class:`LinkedCache` to decode from:

- ``full``: normal prefill of the concatenated ids (the reference).
- ``naive``: cached KV re-rotated to its global positions; only uncached text recomputed.
- ``legolink-k``: also recompute the first ``k`` tokens of every chunk that does not start
  at position 0 (their attention-sink rows, compiled as a sequence start, are wrong here).
- ``legolink-0``: chunks compiled behind dummy BOS tokens (recipe ``bos4``); like ``naive``.
- ``cacheblend-r``: CacheBlend's dynamic selection (see :mod:`ragpic.llm.cacheblend`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache

from .kv import PLAIN, dummy_recipe
from .linked_cache import LinkedCache, additive_mask, forward_with_cache
from .model import LoadedModel
from .rope import rotate_keys
from .segments import Segment, concat_ids, segment_starts
from .slab_pool import SlabPool

LEGOLINK0_DUMMIES = 4  # EPIC: 3 extra BOS + the tokenizer's own BOS


class LinkError(ValueError):
    """The prompt cannot be linked as asked (too long, foreign KV, wrong recipe...)."""


@dataclass(slots=True, frozen=True)
class Method:
    """A parsed link method: ``full``, ``naive``, ``legolink-<k>``, ``cacheblend-<r>``."""

    kind: str
    k: int = 0
    ratio: float = 0.0

    @property
    def name(self) -> str:
        if self.kind == "legolink":
            return f"legolink-{self.k}"
        if self.kind == "cacheblend":
            return f"cacheblend-{round(self.ratio * 100)}"
        return self.kind

    @property
    def recipe(self) -> str:
        """The compile recipe the chunks this method links must have."""
        return dummy_recipe(LEGOLINK0_DUMMIES) if self.kind == "legolink" and self.k == 0 else PLAIN


def parse_method(name: str | Method) -> Method:
    if isinstance(name, Method):
        return name
    kind, _, arg = str(name).strip().lower().partition("-")
    if kind in ("full", "naive") and not arg:
        return Method(kind)
    if kind == "legolink" and arg.isdigit():
        return Method("legolink", k=int(arg))
    if kind == "cacheblend" and arg.replace(".", "", 1).isdigit() and 0 < float(arg) <= 100:
        return Method("cacheblend", ratio=float(arg) / 100)
    raise ValueError(
        f"unknown link method {name!r}: use 'full', 'naive', 'legolink-<k>' (e.g. legolink-16, "
        f"legolink-0) or 'cacheblend-<percent>' (e.g. cacheblend-15)"
    )


@dataclass(slots=True)
class LinkResult:
    """What link hands to decode.

    Attributes:
        logits: ``(V,)`` fp32 logits of the last prompt token.
        cache: KV of all ``num_tokens`` prompt rows, with ``extra_capacity`` rows free.
        recomputed: how many prompt tokens went through the model at link.
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
            if method.kind == "legolink" and start > 0:
                m[: method.k] = True
        parts.append(m)
    mask = torch.cat(parts)
    mask[-1] = True  # its logits start the answer
    return mask


def check_segments(lm: LoadedModel, segments: Sequence[Segment], method: Method, extra_capacity: int) -> int:
    n = sum(s.num_tokens for s in segments)
    if n == 0:
        raise LinkError("the prompt is empty: nothing to link")
    if n + extra_capacity > lm.context_window:
        raise LinkError(
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


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def new_cache(lm: LoadedModel, capacity: int, pool: SlabPool | None = None) -> LinkedCache:
    """An empty cache for ``capacity`` rows, on a pool's idle memory when one is given."""
    if pool is not None:
        return pool.cache(lm.num_layers, lm.num_kv_heads, lm.head_dim, capacity, dtype=lm.dtype, device=lm.device)
    return LinkedCache(lm.num_layers, lm.num_kv_heads, lm.head_dim, capacity, dtype=lm.dtype, device=lm.device)


def fill_cached_rows(lm: LoadedModel, cache: LinkedCache, segments: Sequence[Segment]) -> None:
    """Write each chunk's KV at its rows, keys re-rotated from compile to global positions."""
    for seg, start in zip(segments, segment_starts(segments)):
        if seg.kv is None:
            continue
        kv = seg.kv.to(lm.device, lm.dtype)
        keys, values = cache.rows(start, kv.num_tokens)
        rotate_keys(kv.keys, start - kv.base_position, lm.inv_freq, out=keys)
        values.copy_(kv.values)


def _full(lm: LoadedModel, ids: torch.Tensor, capacity: int,
          pool: SlabPool | None) -> tuple[torch.Tensor, LinkedCache]:
    n = ids.numel()
    dyn = DynamicCache()
    out = forward_with_cache(lm.model, ids[None], torch.arange(n, device=lm.device)[None], dyn, None)
    cache = new_cache(lm, capacity, pool)
    for layer, slab_k, slab_v in zip(dyn.layers, cache.key_slab, cache.value_slab):
        slab_k[:, :, :n] = layer.keys
        slab_v[:, :, :n] = layer.values
    return out.logits[0, -1].float(), cache


def _partial(lm: LoadedModel, ids: torch.Tensor, segments: Sequence[Segment], rec: torch.Tensor,
             capacity: int, pool: SlabPool | None) -> tuple[torch.Tensor, LinkedCache]:
    n = ids.numel()
    cache = new_cache(lm, capacity, pool)
    fill_cached_rows(lm, cache, segments)
    pos = rec.nonzero().squeeze(1).to(lm.device)
    cache.prepare(pos, n)
    mask = additive_mask(pos, n, dtype=lm.dtype, sliding_window=lm.sliding_window)
    out = forward_with_cache(lm.model, ids[pos][None], pos[None], cache, mask, bands=lm.bands(pos))
    return out.logits[0, -1].float(), cache


@torch.inference_mode()
def link(lm: LoadedModel, segments: Sequence[Segment], method: str | Method = "legolink-16",
         *, extra_capacity: int = 0, pool: SlabPool | None = None) -> LinkResult:
    """Build the prompt's KV with ``method`` and return the last token's logits.

    Args:
        segments: the prompt in order; chunk segments carry compiled KV from this model.
        extra_capacity: rows to reserve after the prompt for decoding.
        pool: take the cache's memory from this pool (hand it back with ``pool.release``).
    Raises:
        LinkError: empty or over-long prompt, KV of another model, or wrong compile recipe.
    """
    method = parse_method(method)
    n = check_segments(lm, segments, method, extra_capacity)
    ids = concat_ids(segments).to(lm.device)
    rec = recompute_mask(segments, method)
    _synchronize(lm.device)
    t0 = time.perf_counter()
    if method.kind == "full":
        logits, cache = _full(lm, ids, n + extra_capacity, pool)
    elif method.kind == "cacheblend":
        from .cacheblend import cacheblend_link

        logits, cache, rec = cacheblend_link(lm, ids, segments, rec, method.ratio, n + extra_capacity, pool)
    else:
        logits, cache = _partial(lm, ids, segments, rec, n + extra_capacity, pool)
    cache.length = n
    _synchronize(lm.device)
    return LinkResult(logits=logits, cache=cache, num_tokens=n, recomputed=int(rec.sum()),
                      seconds=time.perf_counter() - t0)
