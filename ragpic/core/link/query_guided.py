"""Query-guided recompute (``qr-<r>[-k<k>]``): let the question say which context to repair.

LegoLink repairs every chunk's first ``k`` tokens (their attention-sink rows) but no chunk's
missing attention to the chunks before it. Here a second pass recomputes, with everything
before them, the spans the question actually reads:

1. **first pass**: ``legolink-k`` (``k = 0``: ``naive``), while an
   :class:`~ragpic.core.ops.attention_probe.AttentionProbe` records how much attention the
   question (the uncached tokens after the last chunk) pays to every prompt token, per layer;
2. **selection**: chunk tokens are grouped into runs of :data:`SPAN` tokens from each chunk's
   start; runs are ranked by the attention they received (averaged over the deeper half of
   the layers, summed over the run) and taken, best first, until they cover ``r`` of the
   chunk tokens;
3. **second pass**: one forward over the chosen runs and every uncached token after the first
   of them (glue, the question, the assistant header), in position order. Each row attends
   to the cache as the first pass left it plus the rows recomputed before it in this pass.

Cost: ``legolink-k`` plus ``r`` of the chunk tokens and the question again. At ``r = 100%``
every row after the first chunk is recomputed in one causal forward: ``full`` exactly. The
probe reads the query inside ragpic's attention function, so the model must run it
(:func:`ragpic.core.model.load_model`'s default).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ragpic.core.cache_fill import fill_cached_rows, new_cache
from ragpic.core.forward import recompute_rows
from ragpic.core.methods import Method
from ragpic.core.model import LoadedModel
from ragpic.core.ops.attention_probe import AttentionProbe
from ragpic.core.ops.linked_cache import LinkedCache
from ragpic.core.ops.slab_pool import SlabPool
from ragpic.core.segments import Segment, segment_starts
from ragpic.errors import LinkError

__all__ = ["SPAN", "chunk_spans", "qr_link", "select_spans", "trailing_text_rows"]

SPAN = 16
"""Tokens per recomputed run: long enough to keep a sentence's tokens together, short enough
that a 3% budget at 4k tokens still buys ~8 separate places."""


PROBE_FROM_LAYER = 0.5
"""Layers whose attention ranks the runs: the deeper half. Over the 20 needle cells
(docs/RESULTS.md §9) it found the needle where ``full`` does in 12 / 16 / 16 of 19 cells at
r = 3 / 10 / 20% (TF KL 0.113 / 0.052 / 0.017), against 14 / 15 / 15 (0.105 / 0.050 / 0.023)
when every layer ranks: better at the budgets that repair most, worse at 3%."""


def chunk_spans(segments: Sequence[Segment], span: int = SPAN) -> list[tuple[int, int]]:
    """``[start, end)`` global positions of every run of ``span`` tokens, from each chunk's start."""
    runs = []
    for seg, start in zip(segments, segment_starts(segments)):
        if seg.is_chunk:
            runs += [(a, min(a + span, start + seg.num_tokens)) for a in range(start, start + seg.num_tokens, span)]
    return runs


def trailing_text_rows(segments: Sequence[Segment]) -> int:
    """Uncached tokens after the last chunk (the question and what follows it), at least 1."""
    rows = 0
    for seg in reversed(segments):
        if seg.is_chunk:
            break
        rows += seg.num_tokens
    return max(rows, 1)


def select_spans(scores: torch.Tensor, runs: Sequence[tuple[int, int]], ratio: float) -> torch.Tensor:
    """``(N,)`` bool on the CPU: the best-scored runs, until they cover ``ratio`` of all run tokens.

    ``scores``: ``(N,)`` fp32 CPU attention per prompt token. Ties keep the earlier run.
    """
    chosen = torch.zeros(scores.numel(), dtype=torch.bool)
    if not runs:
        return chosen
    budget = math.ceil(ratio * sum(b - a for a, b in runs))
    csum = torch.cat((scores.new_zeros(1), scores.double().cumsum(0)))
    weight = torch.tensor([float(csum[b] - csum[a]) for a, b in runs])
    covered = 0
    for i in torch.sort(weight, descending=True, stable=True).indices.tolist():
        if covered >= budget:
            break
        a, b = runs[i]
        chosen[a:b] = True
        covered += b - a
    return chosen


def qr_link(lm: LoadedModel, ids: torch.Tensor, segments: Sequence[Segment], method: Method, first: torch.Tensor,
            capacity: int, pool: SlabPool | None = None) -> tuple[torch.Tensor, LinkedCache, torch.Tensor, int]:
    """Link with ``qr-<r>[-k<k>]``; returns (last logits ``(V,)``, cache, recomputed ``(N,)`` bool,
    rows forwarded over both passes).

    ``ids``: the prompt's ``(N,)`` host ids; ``first``: ``(N,)`` bool CPU mask of the first
    pass (``legolink-k``'s rows).
    Raises:
        LinkError: the model does not run ragpic's attention, so the probe sees nothing.
    """
    if not lm.banded_attention:
        raise LinkError(f"{method.name} reads the question's attention inside ragpic's attention function, "
                        "which this model does not run: load it with ragpic.load_model (or "
                        "wrap_model(..., banded_attention=True)), or pick legolink-16 or cacheblend-15")
    n = ids.numel()
    cache = new_cache(lm, capacity, pool)
    fill_cached_rows(lm, cache, segments)
    probe = AttentionProbe(rows=trailing_text_rows(segments))
    pos1 = first.nonzero().squeeze(1)
    logits = recompute_rows(lm, cache, ids, pos1, n, probe)
    scores = probe.scores(int(PROBE_FROM_LAYER * lm.num_layers)).cpu()  # the pass's one sync
    runs = chunk_spans(segments)
    chosen = select_spans(scores, runs, method.ratio)
    if not chosen.any():  # no chunks: the first pass computed every row
        return logits, cache, first, int(pos1.numel())
    text = torch.ones(n, dtype=torch.bool)  # uncached rows: everything the runs do not cover
    for a, b in runs:
        text[a:b] = False
    after = torch.arange(n) > int(chosen.nonzero()[0])
    second = chosen | (text & after)
    second[-1] = True
    pos2 = second.nonzero().squeeze(1)
    logits = recompute_rows(lm, cache, ids, pos2, n)
    return logits, cache, first | second, int(pos1.numel() + pos2.numel())

