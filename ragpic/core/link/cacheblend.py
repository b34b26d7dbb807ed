"""CacheBlend (Yao et al., EuroSys 2025) as a baseline, on the same linked cache.

CacheBlend picks the tokens to recompute per prompt rather than by position:

1. layer 0 is recomputed for every token (its KV is cheap and fully fresh);
2. layer 1 is recomputed for every token too, and each chunk token's fresh value vectors
   are compared with its cached ones ("KV deviation", summed squared difference over heads
   and dims);
3. the ``ratio`` of chunk tokens with the largest deviation, plus every uncached token
   (template, glue, query), continue through layers 2..L-1; all other tokens keep their
   cached (re-rotated) KV there.

Layers 0 and 1 attend over the whole prompt, so this step costs ``2/L`` of a full prefill
(and, where SDPA's causal kernel cannot be used, an ``N x N`` mask: the memory behaviour
the EPIC paper contrasts with LegoLink). The selection needs layer 1 of every token before
layer 2 of any, so the decoder loop is unrolled here (one :class:`~ragpic.core.forward.Step`
for layers 0-1, one for the rest) rather than run as one model forward, and the link runs whole.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ragpic.core.forward import step_inputs
from ragpic.core.link.plan import Linker
from ragpic.core.model import LoadedModel
from ragpic.core.ops.device import to_device
from ragpic.core.ops.linked_cache import LinkedCache
from ragpic.core.runner import runner_for
from ragpic.core.segments import Segment

__all__ = ["CacheBlend", "select_tokens"]

_CHECK_LAYER = 1
FULL_LAYERS = _CHECK_LAYER + 1
"""Layers every token goes through (0 and 1)."""


def select_tokens(deviation: torch.Tensor, must: torch.Tensor, ratio: float) -> torch.Tensor:
    """``(R,)`` sorted positions: every ``must`` token plus the top ``ratio`` of the others.

    Args:
        deviation: ``(N,)`` fp32 per-token KV deviation at the check layer (any device).
        must: ``(N,)`` bool on the CPU, tokens always recomputed (uncached text, the last token).
    Returns:
        positions on ``deviation``'s device. Counts come from the host ``must``, and ``must``
        tokens are ranked below every candidate rather than cut out with ``nonzero``, so no
        step waits for the device.
    """
    k = math.ceil(ratio * int((~must).sum()))
    fixed = to_device(must.nonzero().squeeze(1), deviation.device)
    if not k:
        return fixed
    ranked = deviation.masked_fill(to_device(must, deviation.device), float("-inf"))
    return torch.cat((fixed, ranked.topk(k).indices)).sort().values


class CacheBlend(Linker):
    """``cacheblend-r``: its recompute mask is the rows every method recomputes (uncached text,
    the last token); the rest of its selection is made while it runs, so it runs whole."""

    pieces_ok = False
    prefix_ok = False  # layers 0-1 recompute every row anyway, and a kept prefix would join the candidates

    def layer_rows(self, segments: Sequence[Segment], num_layers: int) -> list[list[tuple[int, float]]]:
        """Layers 0-1 see every token; deeper ones the fixed rows plus ``r`` of the chunk tokens,
        counted as spread evenly (the selection depends on the data)."""
        rec = self.recompute(segments)
        n = rec.numel()
        pos = rec.nonzero().squeeze(1).double() + 1
        cand = (~rec).nonzero().squeeze(1).double() + 1
        deep = (int(rec.sum()) + math.ceil(self.method.ratio * cand.numel()),
                float(pos.sum()) + self.method.ratio * float(cand.sum()))
        full = min(FULL_LAYERS, num_layers)
        return [[(n, n * (n + 1) / 2)] * full + [deep] * (num_layers - full)]

    def run_whole(self, lm: LoadedModel, segments: Sequence[Segment], ids: torch.Tensor, rec: torch.Tensor,
                  cache: LinkedCache) -> tuple[torch.Tensor, torch.Tensor, int]:
        logits, rec = cacheblend_rows(lm, to_device(ids, lm.device), rec, self.method.ratio, cache)
        return logits, rec, int(rec.sum())


def cacheblend_rows(lm: LoadedModel, ids: torch.Tensor, must: torch.Tensor, ratio: float,
                    cache: LinkedCache) -> tuple[torch.Tensor, torch.Tensor]:
    """Link with CacheBlend-``ratio`` into ``cache`` (its cached rows written); returns (last
    logits ``(V,)``, recomputed ``(N,)`` bool).

    ``ids``: ``(N,)`` on the model's device; ``must``: ``(N,)`` bool on the CPU, the tokens every
    method recomputes (uncached text and the last token). The returned mask (CPU) is what
    went through the deep layers (layers 0-1 saw everything).

    Steps are built twice per link, not per layer: once for layers 0-1 over every token
    (SDPA's causal kernel, no ``N x N`` mask, when the model allows it) and once for the
    selected tokens; reading the selection back to the host (for their plan) is the one sync.
    """
    runner = runner_for(lm)
    n, layers = ids.numel(), lm.num_layers
    rows = torch.arange(n, device=lm.device)
    step = step_inputs(lm, rows, n, host_positions=torch.arange(n), causal=True)
    hidden, rotary = runner.embed(ids, rows)
    check = min(_CHECK_LAYER, layers - 1)
    hidden = runner.layers(hidden, rotary, cache, step, 0, check)
    cached_v = cache.value_slab[check, 0, :, :n].float().clone()
    hidden = runner.layers(hidden, rotary, cache, step, check, check + 1)
    sel_host = torch.arange(n)
    if check + 1 < layers:
        fresh_v = cache.value_slab[check, 0, :, :n].float()
        deviation = (fresh_v - cached_v).pow(2).sum(dim=(0, 2))  # (N,)
        sel = select_tokens(deviation, must, ratio)
        sel_host = sel.cpu()
        hidden = hidden[:, sel]
        rotary = runner.rotary(hidden, sel)
        step = step_inputs(lm, sel, n, host_positions=sel_host)
        hidden = runner.layers(hidden, rotary, cache, step, check + 1, layers)
    cache.length = n
    logits = runner.logits(hidden[0, -1])
    rec = torch.zeros(n, dtype=torch.bool)
    rec[sel_host] = True
    return logits, rec
