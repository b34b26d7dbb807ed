"""The one forward step: positions -> mask -> attention plan -> a forward that writes those rows.

Every model call that reads a :class:`LinkedCache` (link's recompute, CacheBlend's layers,
decode, teacher-forced scoring) builds a :class:`Step` with :func:`step_inputs` and hands it to
the model as the ``ragpic_step`` forward argument, so all of them agree on how positions, the
mask and the attention plan are built. As in gpt-fast, positions are always passed explicitly,
never inferred from the cache; and, as transformers passes ``cache_position``, the rows to
write travel with the forward: the cache's layers read them from the step in ``update``
(docs/ARCHITECTURE.md §4.2). Building a step changes nothing.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache

from ragpic.core.model import LoadedModel
from ragpic.core.ops.attention import AttentionPlan, causal_kernel_ok, plan_attention
from ragpic.core.ops.attention_probe import AttentionProbe
from ragpic.core.ops.device import to_device
from ragpic.core.ops.linked_cache import LinkedCache

__all__ = ["Step", "additive_mask", "cache_kwarg", "forward_rows", "layer_forward", "prefill", "recompute_rows", "run_step",
           "step_inputs"]


@dataclass(slots=True, frozen=True)
class Step:
    """What one forward over ``R`` rows of a linked cache needs, built once for every layer.

    Attributes:
        rows: ``(R,)`` int64 global positions on the model's device, ascending: where the
            tokens sit (``position_ids``) and the cache rows their K/V are written to.
        length: rows visible to attention, these included.
        mask: ``(1, 1, R, length)`` additive mask, or None when SDPA's causal kernel masks.
        plan: the attention plan (:func:`~ragpic.core.ops.attention.plan_attention`), or None.
    """

    rows: torch.Tensor
    length: int
    mask: torch.Tensor | None
    plan: AttentionPlan | None = None

    def kwargs(self) -> dict:
        """The forward's keyword arguments for this step (the cache is passed by the caller)."""
        return {"position_ids": self.rows[None], "attention_mask": self.mask, "use_cache": True,
                "ragpic_step": self, "ragpic_bands": self.plan}


def cache_kwarg(module: torch.nn.Module) -> str:
    """The name a model's (or decoder layer's) forward takes its cache under: ``cache`` since
    transformers 5.24 (which still accepts ``past_key_values`` until 5.40), ``past_key_values``
    for model classes that predate the rename."""
    return _cache_kwarg_of(type(module))


@functools.lru_cache(maxsize=64)
def _cache_kwarg_of(cls: type) -> str:  # per class: decode asks once per token
    params = inspect.signature(cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def step_inputs(lm: LoadedModel, positions: torch.Tensor, length: int, *,
                host_positions: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                causal: bool = False) -> Step:
    """The :class:`Step` of one forward over the tokens at ``positions``.

    The mask lets the token at position ``p`` see keys ``t <= p`` (and the model's sliding
    window); the attention plan (bands, with their masks built once for every layer) is added
    when the model runs banded attention and there is more than one row.

    Args:
        positions: ``(R,)`` int64 global positions, on the model's device, ascending.
        length: rows visible to attention (the prompt so far, these tokens included).
        host_positions: the same positions on the CPU, for the plan (default: ``positions``
            when they are on the CPU, else one device-to-host copy, which waits for the device).
        mask: a prebuilt ``(1, 1, R, length)`` additive mask (decode reuses one buffer).
        causal: the rows are exactly ``0..length-1``. When the live attention is SDPA without a
            window cutting keys, no mask is passed and SDPA's causal kernel masks (no
            ``length x length`` mask, no plan); otherwise as usual.
    """
    if causal and causal_kernel_ok(lm, length):
        return Step(positions, length, None)
    if mask is None:
        mask = additive_mask(positions, length, dtype=lm.dtype, sliding_window=lm.sliding_window)
    plan = None
    if positions.numel() > 1:  # one row: nothing to cut, SDPA as is
        if host_positions is None:
            host_positions = positions.cpu()  # a sync off the CPU: hot paths pass host positions
        plan = plan_attention(lm, host_positions, mask)
    return Step(positions, length, mask, plan)


def run_step(lm: LoadedModel, cache: LinkedCache, input_ids: torch.Tensor, step: Step, logits_to_keep: int = 1,
             probe: AttentionProbe | None = None) -> torch.Tensor:
    """Run the model over ``(R,)`` ids as ``step`` says, writing their K/V into ``cache``.

    Returns ``(logits_to_keep, V)`` logits of the last rows (``0`` keeps all R), in the model
    dtype; ``cache.length`` becomes ``step.length``. ``probe`` records the last rows' attention
    (only under ragpic's attention, which the caller checks).
    """
    if step.length > cache.capacity:
        raise ValueError(f"linked cache holds {cache.capacity} rows, {step.length} requested")
    model = lm.model
    kwargs = step.kwargs()
    if probe is not None:
        kwargs["ragpic_probe"] = probe
    out = model(input_ids=input_ids[None], logits_to_keep=logits_to_keep, **{cache_kwarg(model): cache}, **kwargs)
    cache.length = step.length
    return out.logits[0]


def forward_rows(lm: LoadedModel, cache: LinkedCache, input_ids: torch.Tensor, positions: torch.Tensor,
                 length: int, logits_to_keep: int = 1, *, host_positions: torch.Tensor | None = None,
                 mask: torch.Tensor | None = None, probe: AttentionProbe | None = None) -> torch.Tensor:
    """:func:`run_step` of :func:`step_inputs` (``positions``, ``length``, ``host_positions``, ``mask``)."""
    step = step_inputs(lm, positions, length, host_positions=host_positions, mask=mask)
    return run_step(lm, cache, input_ids, step, logits_to_keep, probe)


def recompute_rows(lm: LoadedModel, cache: LinkedCache, ids: torch.Tensor, host_pos: torch.Tensor,
                   length: int, probe: AttentionProbe | None = None, *, causal: bool = False) -> torch.Tensor:
    """One forward of the prompt tokens at ``host_pos`` into ``cache``; ``(V,)`` fp32 logits of the last.

    ``ids``: the prompt's ``(N,)`` host ids; ``host_pos``: ascending host positions;
    ``length``: the last of them + 1. Each row sees the cache's keys up to its own position,
    which must all be written already (rows loaded from the store, or recomputed earlier or in
    this forward): that is what lets a link run as one forward or, in position order, as
    several (:mod:`ragpic.core.link.pieces`). ``causal``: the rows are every row
    ``0..length-1`` (``full``), which SDPA's causal kernel masks where the model allows it.
    """
    rows = to_device(host_pos, lm.device)
    step = step_inputs(lm, rows, length, host_positions=host_pos, causal=causal)
    return run_step(lm, cache, to_device(ids[host_pos], lm.device), step, probe=probe)[-1].float()


def prefill(model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, cache: Cache,
            logits_to_keep: int = 1) -> torch.Tensor:
    """A plain causal forward of ``(B, T)`` ids into an appending cache (compile); returns
    ``(B, logits_to_keep, V)`` logits. No mask: causal, and padding only trails."""
    out = model(input_ids=input_ids, position_ids=position_ids, attention_mask=None, use_cache=True,
                logits_to_keep=logits_to_keep, **{cache_kwarg(model): cache})
    return out.logits


def layer_forward(layer: torch.nn.Module, hidden: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                  cache: LinkedCache, step: Step, probe: AttentionProbe | None = None) -> torch.Tensor:
    """One decoder layer over ``(1, R, hidden)`` states, writing their K/V into ``cache``.

    ``step`` is shared by every layer over the same rows; ``position_embeddings`` is the
    model's rotary ``(cos, sin)`` for those rows. The caller sets ``cache.length`` once done.
    ``probe`` records the last rows' attention (only under ragpic's attention).
    """
    kwargs = step.kwargs()
    if probe is not None:
        kwargs["ragpic_probe"] = probe
    out = layer(hidden, position_embeddings=position_embeddings, **{cache_kwarg(layer): cache}, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def additive_mask(query_positions: torch.Tensor, kv_length: int, *, dtype: torch.dtype,
                  sliding_window: int | None = None) -> torch.Tensor:
    """``(1, 1, R, kv_length)`` additive mask: query at position ``p`` sees keys ``t <= p``.

    Additive (0 / finfo.min) rather than boolean: a boolean mask is wrong under ``eager``
    attention, an additive one is right for both ``eager`` and ``sdpa``. With a sliding
    window ``w`` the query also stops seeing keys ``t <= p - w``, as Mistral does.
    """
    t = torch.arange(kv_length, device=query_positions.device)
    p = query_positions[:, None]
    allowed = t[None, :] <= p
    if sliding_window is not None:
        allowed &= t[None, :] > p - sliding_window
    mask = torch.zeros(allowed.shape, dtype=dtype, device=query_positions.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]
