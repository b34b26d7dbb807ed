"""The one forward step: rows to write -> additive mask -> attention bands -> forward.

Every model call that reads a :class:`LinkedCache` (link's recompute, CacheBlend's layers,
decode, teacher-forced scoring) goes through :func:`step_inputs`, so the four agree on how
positions, the mask and the bands are built; as in gpt-fast, positions are always passed
explicitly (``input_pos``), never inferred from the cache.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING

import torch
from transformers.cache_utils import Cache

from ragpic.core.ops.attention import additive_mask
from ragpic.core.ops.attention_probe import AttentionProbe
from ragpic.core.ops.device import to_device
from ragpic.core.ops.linked_cache import LinkedCache

if TYPE_CHECKING:
    from ragpic.core.model import LoadedModel

__all__ = ["cache_kwarg", "forward_rows", "layer_forward", "prefill", "recompute_rows", "step_inputs"]


def cache_kwarg(module: torch.nn.Module) -> str:
    """The name a model's (or decoder layer's) forward takes its cache under: ``cache``
    (transformers 5.24+ models) or ``past_key_values``."""
    return _cache_kwarg_of(type(module))


@functools.lru_cache(maxsize=64)
def _cache_kwarg_of(cls: type) -> str:  # per class: decode asks once per token
    params = inspect.signature(cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def step_inputs(lm: LoadedModel, cache: LinkedCache, positions: torch.Tensor, length: int,
                kwarg: str = "past_key_values", *, host_positions: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, causal: bool = False) -> dict:
    """Keyword arguments of one forward over the tokens at ``positions`` into ``cache``.

    Sets the cache to write those tokens' K/V at rows ``positions`` and to show attention
    rows ``[0, length)``; the mask lets the token at position ``p`` see keys ``t <= p`` (and
    the model's sliding window); bands (with their masks, built once for every layer) are
    added when the model runs banded attention and there is more than one row.

    Args:
        positions: ``(R,)`` int64 global positions, on the model's device, ascending.
        length: rows visible to attention (the prompt so far, these tokens included).
        kwarg: the forward's cache argument name (:func:`cache_kwarg`).
        host_positions: the same positions on the CPU, for the bands (default: ``positions``
            when they are on the CPU, else one device-to-host copy, which waits for the device).
        mask: a prebuilt ``(1, 1, R, length)`` additive mask (decode reuses one buffer).
        causal: the rows are exactly ``0..length-1`` (CacheBlend's full layers). When the
            live attention is SDPA without a window cutting keys, no mask is passed and SDPA's
            causal kernel masks (no ``length x length`` mask, no bands); otherwise as usual.
    Returns:
        ``attention_mask`` ``(1, 1, R, length)`` (None when ``causal`` applies),
        ``position_ids`` ``(1, R)``, the cache under ``kwarg``, ``use_cache`` and, with banded
        attention, ``ragpic_bands`` (a :class:`~ragpic.core.ops.attention.BandPlan`).
    """
    cache.prepare(positions, length)
    kwargs = {"position_ids": positions[None], "use_cache": True, kwarg: cache}
    if causal and lm.causal_kernel_ok(length):
        kwargs["attention_mask"] = None
        return kwargs
    if mask is None:
        mask = additive_mask(positions, length, dtype=lm.dtype, sliding_window=lm.sliding_window)
    kwargs["attention_mask"] = mask
    if positions.numel() > 1 and lm.banded_attention:  # one row: nothing to cut, SDPA as is
        if host_positions is None:
            host_positions = positions.cpu()  # a sync off the CPU: hot paths pass host positions
        kwargs["ragpic_bands"] = lm.band_plan(host_positions, mask)
    return kwargs


def forward_rows(lm: LoadedModel, cache: LinkedCache, input_ids: torch.Tensor, positions: torch.Tensor,
                 length: int, logits_to_keep: int = 1, *, host_positions: torch.Tensor | None = None,
                 mask: torch.Tensor | None = None, probe: AttentionProbe | None = None) -> torch.Tensor:
    """Run the model over ``(R,)`` ids at ``(R,)`` positions into ``cache``; returns
    ``(logits_to_keep, V)`` logits of the last rows (``0`` keeps all R), in the model dtype.
    ``host_positions`` and ``mask``: as in :func:`step_inputs`; ``probe`` records the last
    rows' attention (only under ragpic's attention, which the caller checks)."""
    model = lm.model
    kwargs = step_inputs(lm, cache, positions, length, cache_kwarg(model), host_positions=host_positions, mask=mask)
    if probe is not None:
        kwargs["ragpic_probe"] = probe
    out = model(input_ids=input_ids[None], logits_to_keep=logits_to_keep, **kwargs)
    return out.logits[0]


def recompute_rows(lm: LoadedModel, cache: LinkedCache, ids: torch.Tensor, host_pos: torch.Tensor,
                   length: int, probe: AttentionProbe | None = None) -> torch.Tensor:
    """One forward of the prompt tokens at ``host_pos`` into ``cache``; ``(V,)`` fp32 logits of the last.

    ``ids``: the prompt's ``(N,)`` host ids; ``host_pos``: ascending host positions;
    ``length``: the last of them + 1. Each row sees the cache's keys up to its own position,
    which must all be written already (rows loaded from the store, or recomputed earlier or in
    this forward): that is what lets a link run as one forward or, in position order, as
    several (:mod:`ragpic.core.chunked_link`, :mod:`ragpic.core.query_guided`). ``probe``: as in
    :func:`forward_rows`.
    """
    logits = forward_rows(lm, cache, to_device(ids[host_pos], lm.device), to_device(host_pos, lm.device),
                          length, host_positions=host_pos, probe=probe)
    return logits[-1].float()


def prefill(model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, cache: Cache,
            logits_to_keep: int = 1) -> torch.Tensor:
    """A plain causal forward of ``(B, T)`` ids into an appending cache (compile, ``full``);
    returns ``(B, logits_to_keep, V)`` logits. No mask: causal, and padding only trails."""
    out = model(input_ids=input_ids, position_ids=position_ids, attention_mask=None, use_cache=True,
                logits_to_keep=logits_to_keep, **{cache_kwarg(model): cache})
    return out.logits


def layer_forward(layer: torch.nn.Module, hidden: torch.Tensor,
                  position_embeddings: tuple[torch.Tensor, torch.Tensor], inputs: dict) -> torch.Tensor:
    """One decoder layer over ``(1, R, hidden)`` states, writing their K/V.

    ``inputs`` come from :func:`step_inputs` (built once and shared by every layer over the
    same rows); ``position_embeddings`` is the model's rotary ``(cos, sin)`` for those rows.
    """
    out = layer(hidden, position_embeddings=position_embeddings, **inputs)
    return out[0] if isinstance(out, tuple) else out
