"""One-pass query-guided recompute (``qp-<r>[-k<k>][-d<d>]``): probe the question early, recompute once.

``qr`` (:mod:`ragpic.core.link.query_guided`) runs a whole ``legolink-k`` pass before it knows
which runs to repair, then a second pass over them and the question; rows of its first pass
never see the repaired runs. Here the question's attention is read at a few shallow layers
(QCFuse's profiled layers) and the link then runs **one** forward:

1. **probe**: ``legolink-k``'s rows go through layers ``0..P-1`` only (``P`` = the method's
   ``depth`` of the layers, half unless its name says ``-d<percent>``) while an
   :class:`~ragpic.core.ops.attention_probe.AttentionProbe` records the attention the question
   pays to every prompt token; the last :data:`PROFILED_LAYERS` of them rank the chunk's
   16-token runs (:func:`~ragpic.core.link.query_guided.chunk_spans`; sentence runs with ``-s``), rows the forward
   recomputes anyway scoring nothing, and the best runs are taken until they cover ``r`` of
   the chunk tokens (:func:`~ragpic.core.link.query_guided.select_spans`; with ``-h<n>``, half
   of them by score and the rest by following rare tokens, :mod:`ragpic.core.link.hops`);
2. **forward**: ``legolink-k``'s rows plus the chosen runs, every layer, in position order:
   every chunk start and the question see the chosen runs' fresh KV, and the question goes
   through the model once.

Cost: ``P / L`` of ``legolink-k``'s rows, then ``legolink-k``'s rows plus ``r`` of the chunk
tokens. The probe's KV rows (layers ``< P``) are all rewritten by the forward, so at
``r = 100%`` the forward covers every row: ``full`` exactly. Like ``qr`` it needs the model
to run ragpic's attention, and it runs whole.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ragpic.core.forward import step_inputs
from ragpic.core.link.plan import Linker
from ragpic.core.link.query_guided import (check_probe_runs, method_runs, select_runs, spread_rows,
                                           trailing_text_rows)
from ragpic.core.model import LoadedModel
from ragpic.core.ops.attention_probe import AttentionProbe
from ragpic.core.ops.device import to_device
from ragpic.core.ops.linked_cache import LinkedCache
from ragpic.core.runner import recompute_rows, runner_for
from ragpic.core.segments import Segment

__all__ = ["PROFILED_LAYERS", "QueryProbe", "probe_layers", "shallow_pass"]

PROFILED_LAYERS = 2
"""How many of the probe pass's last layers rank the runs."""


def probe_layers(num_layers: int, depth: float) -> int:
    """Layers the probe pass runs: ``ceil(depth * L)``, at least :data:`PROFILED_LAYERS`, at most ``L``."""
    return min(num_layers, max(PROFILED_LAYERS, math.ceil(depth * num_layers)))


def shallow_pass(lm: LoadedModel, cache: LinkedCache, ids: torch.Tensor, host_pos: torch.Tensor, length: int,
                 layers: int, probe: AttentionProbe) -> None:
    """Run the prompt tokens at ``host_pos`` through the first ``layers`` decoder layers only,
    writing their K/V there, with ``probe`` recording their last rows' attention per layer.

    ``ids``: the prompt's ``(N,)`` host ids; ``host_pos``: ``(R,)`` ascending host positions;
    ``length``: the last of them + 1. No logits: the deeper layers never run.
    """
    runner = runner_for(lm)
    rows = to_device(host_pos, lm.device)
    step = step_inputs(lm, rows, length, host_positions=host_pos)
    hidden, rotary = runner.embed(to_device(ids[host_pos], lm.device), rows)
    runner.layers(hidden, rotary, cache, step, 0, layers, probe=probe)


class QueryProbe(Linker):
    """``qp-<r>[-k<k>][-d<d>][-h<n>][-w][-s]``: :meth:`recompute` is ``legolink-k``'s rows (the probe pass's and the
    forward's fixed part); the runs the forward adds are chosen while it runs, so it runs whole."""

    pieces_ok = False

    def layer_rows(self, segments: Sequence[Segment], num_layers: int) -> list[list[tuple[int, float]]]:
        """The probe pass (``P`` layers of ``legolink-k``'s rows), then the forward: those rows plus
        ``r`` of the chunk tokens, counted as spread evenly (the choice depends on the data)."""
        first = super().layer_rows(segments, num_layers)[0][0]
        rows, pos_sum = spread_rows(segments, self.method.ratio)
        forward = (first[0] + rows, first[1] + pos_sum)
        return [[first] * probe_layers(num_layers, self.method.depth), [forward] * num_layers]

    def run_whole(self, lm: LoadedModel, segments: Sequence[Segment], ids: torch.Tensor, rec: torch.Tensor,
                  cache: LinkedCache) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Returns (last logits ``(V,)``, recomputed ``(N,)`` bool, rows forwarded over both passes).

        ``ids``: the prompt's ``(N,)`` host ids; ``rec``: ``(N,)`` bool CPU mask of ``legolink-k``'s rows.
        Raises:
            LinkError: the model does not run ragpic's attention, so the probe sees nothing.
        """
        check_probe_runs(lm, self.name)
        n, probed = ids.numel(), 0
        runs = method_runs(lm, segments, ids, self.method)
        if runs:
            layers = probe_layers(lm.num_layers, self.method.depth)
            tail = trailing_text_rows(segments)
            probe = AttentionProbe(rows=tail, from_layer=layers - PROFILED_LAYERS)
            first = rec.nonzero().squeeze(1)
            shallow_pass(lm, cache, ids, first, int(first[-1]) + 1, layers, probe)
            probed = int(first.numel())
            scores = probe.scores().cpu()  # the link's one sync
            scores[rec] = 0  # rows the forward recomputes anyway: no budget spent on them
            rec = rec | select_runs(scores, runs, self.method, ids, tail)
        pos = rec.nonzero().squeeze(1)
        logits = recompute_rows(lm, cache, ids, pos, n)
        return logits, rec, probed + int(pos.numel())
