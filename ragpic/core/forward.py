"""The one forward step: positions -> mask -> attention plan, for a forward that writes those rows.

Every model call that reads a :class:`LinkedCache` (link's recompute, CacheBlend's layers,
decode, teacher-forced scoring) builds a :class:`Step` with :func:`step_inputs` and hands it to
the model runner (:mod:`ragpic.core.runner`), which passes it as the ``ragpic_step`` forward argument, so all of them agree on how positions, the
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

from ragpic.core.model import LoadedModel
from ragpic.core.ops.attention import AttentionPlan, causal_kernel_ok, plan_attention

__all__ = ["Step", "additive_mask", "cache_kwarg", "step_inputs"]


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
