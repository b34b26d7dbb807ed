"""Second-order selection (``-h<n>``, ``-w`` on ``qr`` / ``qp``): runs named by what was chosen, or by the question.

The question's attention finds the runs it reads directly, but not the runs *those* runs
depend on in other chunks: in a chain ``VAR A = 12345`` ... ``VAR B = VAR A`` ... the question
names the value, so its probe points at the first link and never at ``VAR B = VAR A``, whose
KV, compiled without the chunk that defines ``A``, is the one that needs repair
(docs/ARCHITECTURE.md §4.9). A run that shares a *rare* token with a
chosen run (a name, an id, a code: a token few runs of the prompt hold) is where such a
dependency lives, so selection goes:

1. **seeds**: the best-scored runs, until they cover half the budget; with ``-w`` also windows
   around the run occurrences of the question's own rare tokens (held by at most
   :data:`QUESTION_RUNS` runs: the key a multi-value question asks for, whose needles its
   attention, read through a stale cache, finds only some of);
2. **hops** (``n`` rounds): around every occurrence, outside what is chosen, of a rare token
   of what the previous round added, a window of :data:`WINDOW` tokens (with ``-s``, the
   sentence run that holds it: :mod:`ragpic.core.link.sentences`), kept when it holds at
   least :data:`MIN_SHARED` of those tokens; the windows holding the most first, then by
   score, while budget remains;
3. **fill**: the rest of the budget by score, as plain selection does.

A token is rare when at most :data:`RARE_RUNS` runs of the prompt contain it. Everything is
read from the prompt's token ids: no pass over the model, no stored data. At a 100% budget
every run is chosen, as without hops, so the recipe stays exactly ``full``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["MIN_SHARED", "QUESTION_RUNS", "RARE_RUNS", "SEED_SHARE", "WINDOW", "rank_runs", "select_with_hops",
           "take_runs"]

RARE_RUNS = 3
"""A token held by at most this many runs links them (a 4-hop chain names each variable in
two runs; words of the filler text are in many)."""

SEED_SHARE = 0.5
"""Share of the budget the question's own best runs take before the hops."""

WINDOW = 16
"""Tokens a hop repairs around each occurrence of a rare token (as many as a run)."""

QUESTION_RUNS = 4
"""``-w``: a question's token held by at most this many runs names what the question asks for
(a key several needles share, an entity); the filler's words are in more. On the 1.5B's RULER
prompts 8 and 16 covered no more of the multi-value needles and less of vt's chain
(docs/RESULTS.md §26, ``benchmarks/needle_coverage.py``)."""

MIN_SHARED = 2
"""Rare tokens a hop window must share with the last round: a name or id is split into
several tokens, and one shared rare word is most often chance (a filler word in two places)."""


def rank_runs(scores: torch.Tensor, runs: Sequence[tuple[int, int]]) -> tuple[torch.Tensor, list[int]]:
    """``(csum, order)``: the ``(N + 1,)`` fp64 prefix sums of ``scores`` (a span's weight is
    ``csum[b] - csum[a]``) and the run indices, best summed score first; ties keep the earlier run.

    ``scores``: ``(N,)`` fp32 CPU attention per prompt token; ``runs``: ``[start, end)`` of each run.
    The one ranking plain selection and the hops' seeds and fill share.
    """
    csum = torch.cat((scores.new_zeros(1, dtype=torch.float64), scores.double().cumsum(0)))
    weight = [float(csum[b] - csum[a]) for a, b in runs]
    return csum, sorted(range(len(runs)), key=lambda i: -weight[i])  # sorted is stable


def take_runs(order: Sequence[int], runs: Sequence[tuple[int, int]], mask: torch.Tensor, budget: int,
              covered: int) -> int:
    """Add whole runs in ``order`` to ``mask`` (``(N,)`` bool) until ``covered`` (tokens) reaches
    ``budget``; returns the tokens covered. Tokens already in ``mask`` are not counted twice."""
    for i in order:
        if covered >= budget:
            break
        a, b = runs[i]
        covered += int((~mask[a:b]).sum())
        mask[a:b] = True
    return covered


def _follow(frontier: set[int], positions: dict[int, list[int]], tokens: list[int], mask: torch.Tensor,
            in_run: torch.Tensor, csum: torch.Tensor, budget: int, covered: int,
            run_of: dict[int, tuple[int, int]] | None = None) -> tuple[int, torch.Tensor]:
    """One round: windows around the uncovered occurrences of ``frontier`` tokens that hold at
    least :data:`MIN_SHARED` of them, most shared first, then by score, into ``mask`` while
    ``covered < budget``. Returns (tokens covered, ``(N,)`` bool of what this round added).
    ``run_of`` (``-s``): position -> the run holding it, which is then the window."""
    windows = []  # (centre, start, end, frontier tokens inside)
    for t in frontier:
        for p in positions[t]:
            if not mask[p]:
                a, b = run_of[p] if run_of is not None else \
                    (max(0, p - WINDOW // 2), min(mask.numel(), p + WINDOW - WINDOW // 2))
                shared = len(set(tokens[a:b]) & frontier)
                if shared >= MIN_SHARED:
                    windows.append((p, a, b, shared))
    fresh = torch.zeros_like(mask)
    for p, a, b, _ in sorted(windows, key=lambda w: (-w[3], -float(csum[w[2]] - csum[w[1]]), w[0])):
        if covered >= budget:
            break
        if mask[p]:  # an earlier window of this round took it
            continue
        new = in_run[a:b] & ~mask[a:b]
        covered += int(new.sum())
        mask[a:b] |= new
        fresh[a:b] |= new
    return covered, fresh


def select_with_hops(scores: torch.Tensor, runs: Sequence[tuple[int, int]], ratio: float, ids: torch.Tensor,
                     hops: int, question: Sequence[int] = (),
                     question_runs: int = QUESTION_RUNS, whole_runs: bool = False) -> torch.Tensor:
    """``(N,)`` bool on the CPU: seeds by score, then ``hops`` rounds of windows around the
    occurrences of the last round's rare tokens, then the rest of ``ratio`` of the run tokens by score.

    ``scores``: ``(N,)`` fp32 CPU attention per prompt token; ``runs``: ``[start, end)`` of each
    run; ``ids``: the prompt's ``(N,)`` host token ids; ``question``: the question's ids
    (``-w``): before the hops, windows around the run occurrences of its words held by at
    most ``question_runs`` runs join the seeds. A hop window is the :data:`WINDOW`
    run tokens centred on an occurrence (a link such as ``VAR B = VAR A`` may straddle two
    runs: the window keeps it whole). Ties keep the earlier run / position.
    """
    mask = torch.zeros(scores.numel(), dtype=torch.bool)
    if not runs:
        return mask
    budget = math.ceil(ratio * sum(b - a for a, b in runs))
    csum, by_score = rank_runs(scores, runs)
    tokens = ids.tolist()  # read per position below: one host list, not a tensor index each time
    in_run = torch.zeros_like(mask)
    holders: dict[int, set[int]] = {}
    positions: dict[int, list[int]] = {}  # token -> its run positions, ascending
    for i, (a, b) in enumerate(runs):
        in_run[a:b] = True
        for p in range(a, b):
            holders.setdefault(tokens[p], set()).add(i)
            positions.setdefault(tokens[p], []).append(p)
    rare = {t for t, h in holders.items() if len(h) <= RARE_RUNS}
    run_of = {p: (a, b) for a, b in runs for p in range(a, b)} if whole_runs else None

    covered = take_runs(by_score, runs, mask, math.ceil(SEED_SHARE * budget) if hops or question else budget, 0)
    fresh = mask.clone()
    if question:
        named = {t for t in question if 0 < len(holders.get(t, ())) <= question_runs}
        covered, found = _follow(named, positions, tokens, mask, in_run, csum, budget, covered, run_of)
        fresh |= found
    for _ in range(hops):
        if covered >= budget:
            break
        covered, fresh = _follow(set(ids[fresh].tolist()) & rare, positions, tokens, mask, in_run, csum, budget,
                                 covered, run_of)
        if not fresh.any():
            break
    take_runs(by_score, runs, mask, budget, covered)
    return mask
