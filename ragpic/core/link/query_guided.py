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

With ``-t<m>`` the second pass recomputes only the question's last ``m`` rows: the rows before
them keep the first pass's KV (they saw the chunks as ``legolink-k`` left them), and the answer
reads the repaired runs through the last rows and its own. It saves the question's second
pass, which on RULER's ~60-token questions is a third of a 10x link's rows; when every run
is chosen the whole question is recomputed again, so ``qr-100-t<m>`` is still ``full``.

Cost: ``legolink-k`` plus ``r`` of the chunk tokens and the question again. At ``r = 100%``
every row after the first chunk is recomputed in one causal forward: ``full`` exactly. The
probe reads the query inside ragpic's attention function, so the model must run it
(:func:`ragpic.core.model.load_model`'s default). Its rows depend on the first pass, so it
runs whole; its recompute mask is the first pass's (``legolink-k``'s rows).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ragpic.core.runner import recompute_rows
from ragpic.core.link.hops import rank_runs, select_with_hops, take_runs
from ragpic.core.link.plan import Linker
from ragpic.core.link.sentences import sentence_ends, sentence_spans
from ragpic.core.model import LoadedModel
from ragpic.core.ops.attention import uses_banded_attention
from ragpic.core.ops.attention_probe import AttentionProbe
from ragpic.core.ops.linked_cache import LinkedCache
from ragpic.core.segments import Segment, segment_starts
from ragpic.errors import LinkError

__all__ = ["SPAN", "QueryGuided", "check_probe_runs", "chunk_spans", "method_runs", "select_runs", "select_spans",
           "spread_rows", "trailing_text_rows"]

SPAN = 16
"""Tokens per recomputed run: long enough to keep a sentence's tokens together, short enough
that a 3% budget at 4k tokens still buys ~8 separate places."""


PROBE_FROM_LAYER = 0.5
"""Layers whose attention ranks the runs: the deeper half. Over the 20 needle cells
(docs/RESULTS.md §9) it found the needle where ``full`` does in 12 / 16 / 16 of 19 cells at
r = 3 / 10 / 20% (TF KL 0.113 / 0.052 / 0.017), against 14 / 15 / 15 (0.105 / 0.050 / 0.023)
when every layer ranks: better at the budgets that repair most, worse at 3%."""


def chunk_spans(segments: Sequence[Segment], span: int = SPAN) -> list[tuple[int, int]]:
    """``[start, end)`` global positions of every run of ``span`` tokens, from each chunk's start.

    A chunk at position 0 (a kept prefix, :mod:`ragpic.engine.prefix`, or a prompt that
    starts with a chunk) has no runs: its compiled KV is already ``full``'s, so repairing it
    would buy nothing, and the budget ``r`` counts only chunks that can be wrong."""
    runs = []
    for seg, start in zip(segments, segment_starts(segments)):
        if seg.is_chunk and start > 0:
            runs += [(a, min(a + span, start + seg.num_tokens)) for a in range(start, start + seg.num_tokens, span)]
    return runs


def method_runs(lm: LoadedModel, segments: Sequence[Segment], ids: torch.Tensor, method) -> list[tuple[int, int]]:
    """The runs ``method`` (``qr`` / ``qp``) chooses among: sentence runs with ``-s``
    (:mod:`ragpic.core.link.sentences`, marks read from ``ids``, the prompt's ``(N,)`` host
    ids), else :func:`chunk_spans`. Both cover the same tokens."""
    if method.sentences:
        return sentence_spans(segments, sentence_ends(lm.tokenizer, ids))
    return chunk_spans(segments)


def trailing_text_rows(segments: Sequence[Segment]) -> int:
    """Uncached tokens after the last chunk (the question and what follows it), at least 1."""
    rows = 0
    for seg in reversed(segments):
        if seg.is_chunk:
            break
        rows += seg.num_tokens
    return max(rows, 1)


def spread_rows(segments: Sequence[Segment], ratio: float) -> tuple[int, float]:
    """``ratio`` of the chunk tokens as ``(rows, sum of their (position + 1))``, counted as spread
    evenly over the chunks: the FLOP count of a selection that depends on the data."""
    runs = chunk_spans(segments)
    tokens = sum(b - a for a, b in runs)
    return math.ceil(ratio * tokens), ratio * sum((a + 1 + b) * (b - a) / 2 for a, b in runs)


def check_probe_runs(lm: LoadedModel, method: str) -> None:
    """Raise :class:`LinkError` unless the model runs ragpic's attention, where the probe reads
    the question's attention (``qr``, ``qp``)."""
    if not uses_banded_attention(lm.model):
        raise LinkError(f"{method} reads the question's attention inside ragpic's attention function, "
                        "which this model does not run: load it with ragpic.load_model (or "
                        "wrap_model(..., banded_attention=True)), or pick legolink-16 or cacheblend-15")


def select_spans(scores: torch.Tensor, runs: Sequence[tuple[int, int]], ratio: float) -> torch.Tensor:
    """``(N,)`` bool on the CPU: the best-scored runs, until they cover ``ratio`` of all run tokens.

    ``scores``: ``(N,)`` fp32 CPU attention per prompt token. Ties keep the earlier run.
    """
    chosen = torch.zeros(scores.numel(), dtype=torch.bool)
    if runs:
        take_runs(rank_runs(scores, runs)[1], runs, chosen, math.ceil(ratio * sum(b - a for a, b in runs)), 0)
    return chosen


def select_runs(scores: torch.Tensor, runs: Sequence[tuple[int, int]], method, ids: torch.Tensor,
                trailing: int) -> torch.Tensor:
    """The runs ``method`` (``qr`` / ``qp``) repairs: :func:`select_spans`, or with ``-h<n>`` / ``-w``
    :func:`~ragpic.core.link.hops.select_with_hops`, whose windows are whole runs under ``-s``
    (``ids``: the prompt's ``(N,)`` host ids; ``trailing``: the question's rows at its end,
    :func:`trailing_text_rows`)."""
    if method.hops or method.words:
        question = ids[-trailing:].tolist() if method.words else ()
        return select_with_hops(scores, runs, method.ratio, ids, method.hops, question, whole_runs=method.sentences)
    return select_spans(scores, runs, method.ratio)


class QueryGuided(Linker):
    """``qr-<r>[-k<k>][-h<n>][-w][-s][-t<m>]``: :meth:`recompute` is the first pass (``legolink-k``); it runs whole."""

    pieces_ok = False

    def layer_rows(self, segments: Sequence[Segment], num_layers: int) -> list[list[tuple[int, float]]]:
        """The first pass, then ``r`` of the chunk tokens (counted as spread evenly: the choice
        depends on the data) and the question again (its last ``m`` rows with ``-t<m>``)."""
        first = super().layer_rows(segments, num_layers)
        n = sum(s.num_tokens for s in segments)
        rows, pos_sum = spread_rows(segments, self.method.ratio)
        tail = trailing_text_rows(segments)
        if self.method.tail and self.method.ratio < 1:
            tail = min(tail, self.method.tail)
        second = (rows + tail, pos_sum + tail * (n - (tail - 1) / 2))
        return first + [[second] * num_layers]

    def run_whole(self, lm: LoadedModel, segments: Sequence[Segment], ids: torch.Tensor, rec: torch.Tensor,
                  cache: LinkedCache) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Returns (last logits ``(V,)``, recomputed ``(N,)`` bool, rows forwarded over both passes).

        ``ids``: the prompt's ``(N,)`` host ids; ``rec``: ``(N,)`` bool CPU mask of the first
        pass (``legolink-k``'s rows).
        Raises:
            LinkError: the model does not run ragpic's attention, so the probe sees nothing.
        """
        check_probe_runs(lm, self.name)
        n, first, tail = ids.numel(), rec, trailing_text_rows(segments)
        probe = AttentionProbe(rows=tail, from_layer=int(PROBE_FROM_LAYER * lm.num_layers))
        pos1 = first.nonzero().squeeze(1)
        logits = recompute_rows(lm, cache, ids, pos1, n, probe)
        scores = probe.scores().cpu()  # the pass's one sync
        runs = method_runs(lm, segments, ids, self.method)
        chosen = select_runs(scores, runs, self.method, ids, tail)
        if not chosen.any():  # no chunks: the first pass computed every row
            return logits, first, int(pos1.numel())
        text = torch.ones(n, dtype=torch.bool)  # uncached rows: everything the runs do not cover
        for a, b in runs:
            text[a:b] = False
        after = torch.arange(n) > int(chosen.nonzero()[0])
        second = chosen | (text & after)
        if self.method.tail and not bool((chosen | text).all()):
            # -t<m>: the question's earlier rows keep the first pass's KV (ARCHITECTURE §4.9)
            second[n - tail:n - self.method.tail] = False
        second[-1] = True
        pos2 = second.nonzero().squeeze(1)
        logits = self.second_pass(lm, segments, cache, ids, pos2, chosen)
        return logits, first | second, int(pos1.numel() + pos2.numel())

    def second_pass(self, lm: LoadedModel, segments: Sequence[Segment], cache: LinkedCache, ids: torch.Tensor,
                    rows: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """The second pass over ``rows`` (``(R,)`` ascending host positions: the chosen runs and
        the text after the first of them); ``chosen``: ``(N,)`` bool, the runs' rows. Returns the
        last row's ``(V,)`` fp32 logits. One causal forward through every layer; a variant may
        forward some rows through fewer (``benchmarks/late_start.py``)."""
        return recompute_rows(lm, cache, ids, rows, ids.numel())
