"""Second-order selection (``-h<n>`` on ``qr`` / ``qp``): follow the runs the chosen runs name.

The question's attention finds the runs it reads directly, but not the runs *those* runs
depend on in other chunks: in a chain ``VAR A = 12345`` ... ``VAR B = VAR A`` ... the question
names the value, so its probe points at the first link and never at ``VAR B = VAR A``, whose
KV, compiled without the chunk that defines ``A``, is the one that needs repair
(docs/ARCHITECTURE.md §4.2, "connecting the hops"). A run that shares a *rare* token with a
chosen run (a name, an id, a code: a token few runs of the prompt hold) is where such a
dependency lives, so selection goes:

1. **seeds**: the best-scored runs, until they cover half the budget;
2. **hops** (``n`` rounds): the runs not yet chosen that share a rare token with the runs the
   previous round added, most shared tokens first, then by score, while budget remains;
3. **fill**: the rest of the budget by score, as plain selection does.

A token is rare when at most :data:`RARE_RUNS` runs of the prompt contain it. Everything is
read from the prompt's token ids: no pass over the model, no stored data. At a 100% budget
every run is chosen, as without hops, so the recipe stays exactly ``full``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["RARE_RUNS", "SEED_SHARE", "select_with_hops"]

RARE_RUNS = 3
"""A token held by at most this many runs links them (a 4-hop chain names each variable in
two runs; words of the filler text are in many)."""

SEED_SHARE = 0.5
"""Share of the budget the question's own best runs take before the hops."""


def _take(order: Sequence[int], runs: Sequence[tuple[int, int]], chosen: list[bool], budget: int,
          covered: int) -> tuple[int, list[int]]:
    added = []
    for i in order:
        if covered >= budget:
            break
        if not chosen[i]:
            chosen[i] = True
            covered += runs[i][1] - runs[i][0]
            added.append(i)
    return covered, added


def select_with_hops(scores: torch.Tensor, runs: Sequence[tuple[int, int]], ratio: float, ids: torch.Tensor,
                     hops: int) -> torch.Tensor:
    """``(N,)`` bool on the CPU: seeds by score, then ``hops`` rounds of runs that share a rare
    token with the last round's, then the rest of ``ratio`` of the run tokens by score.

    ``scores``: ``(N,)`` fp32 CPU attention per prompt token; ``runs``: ``[start, end)`` of each
    run; ``ids``: the prompt's ``(N,)`` host token ids. Ties keep the earlier run.
    """
    mask = torch.zeros(scores.numel(), dtype=torch.bool)
    if not runs:
        return mask
    budget = math.ceil(ratio * sum(b - a for a, b in runs))
    csum = torch.cat((scores.new_zeros(1), scores.double().cumsum(0)))
    weight = [float(csum[b] - csum[a]) for a, b in runs]
    by_score = sorted(range(len(runs)), key=lambda i: -weight[i])  # stable: ties keep the earlier run
    tokens = [set(ids[a:b].tolist()) for a, b in runs]
    holders: dict[int, list[int]] = {}
    for i, toks in enumerate(tokens):
        for t in toks:
            holders.setdefault(t, []).append(i)
    rare = {t for t, h in holders.items() if len(h) <= RARE_RUNS}

    chosen = [False] * len(runs)
    covered, frontier = _take(by_score, runs, chosen, math.ceil(SEED_SHARE * budget) if hops else budget, 0)
    for _ in range(hops):
        shared: dict[int, int] = {}
        for i in frontier:
            for t in tokens[i] & rare:
                for j in holders[t]:
                    if not chosen[j]:
                        shared[j] = shared.get(j, 0) + 1
        if not shared:
            break
        order = sorted(shared, key=lambda j: (-shared[j], -weight[j], j))
        covered, frontier = _take(order, runs, chosen, budget, covered)
    _take(by_score, runs, chosen, budget, covered)
    for i, (a, b) in enumerate(runs):
        if chosen[i]:
            mask[a:b] = True
    return mask
