"""``prior-<r>[-k<k>]``: LegoLink's rows plus the tokens each chunk's compile-time prior ranks first.

The rows are fixed before the link runs, as ``legolink-k``'s are, so it runs in pieces at the
rows family's cost: ``legolink-k``'s rows plus ``r`` of every chunk's tokens, with no pass over
the prompt to choose them (CacheBlend's layers 0-1, ``qp``'s probe). The choice is each chunk's
prior (:mod:`ragpic.core.prior`), measured when the chunk was compiled with recipe ``prior``.
At ``r = 100%`` every chunk row is recomputed, causally: ``full`` exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ragpic.core.link.plan import Linker
from ragpic.core.segments import Segment, segment_starts
from ragpic.errors import LinkError

__all__ = ["PriorRows", "prior_rows"]


def prior_rows(prior: torch.Tensor, fixed: torch.Tensor, ratio: float) -> torch.Tensor:
    """``(T,)`` bool: ``fixed`` plus the ``ceil(ratio * T)`` tokens not in it that ``prior`` ranks highest.

    Args:
        prior: ``(T,)`` fp32, one chunk's prior (higher: its KV moves more behind other text).
        fixed: ``(T,)`` bool, the chunk's rows recomputed anyway (its first ``k``).
    Ties go to the earlier token (``topk`` over a stable order), so a mask is reproducible.
    """
    free = ~fixed
    n = min(math.ceil(ratio * prior.numel()), int(free.sum()))
    rows = fixed.clone()
    if n:
        ranked = prior.float().masked_fill(fixed, float("-inf"))
        order = torch.sort(ranked, descending=True, stable=True).indices
        rows[order[:n]] = True
    return rows


class PriorRows(Linker):
    """``prior-<r>[-k<k>]``: the base rule with ``k`` plus :func:`prior_rows` in every chunk that
    does not start at position 0; runs in pieces."""

    def recompute(self, segments: Sequence[Segment]) -> torch.Tensor:
        mask = super().recompute(segments)
        for i, (seg, start) in enumerate(zip(segments, segment_starts(segments))):
            if not seg.is_chunk or start == 0:  # a chunk at 0 was compiled where it sits: exact
                continue
            if seg.kv.prior is None:
                raise LinkError(f"segment {i} has no prior: {self.name} links chunks compiled with recipe "
                                f"'prior'; recompile it for this method")
            end = start + seg.num_tokens
            mask[start:end] = prior_rows(seg.kv.prior, mask[start:end], self.method.ratio)
        return mask
