"""Second-order selection (``-h<n>``, :mod:`ragpic.core.link.hops`) on raw tensors and tiny models
(its exactness at a 100% budget is tested beside qr's and qp's, tests/core/test_query_guided.py)."""

from __future__ import annotations

import torch

from ragpic.core.link import link
from ragpic.core.link.hops import select_with_hops
from ragpic.core.link.query_guided import select_spans
from ragpic.core.methods import parse_method
from prompts import compile_texts, linked_prompt
from tiny import tiny_lm

COMMON = 7  # a filler token in every run


def chain_prompt() -> tuple[torch.Tensor, list[tuple[int, int]], torch.Tensor]:
    """Ten 4-token runs of filler; a chain 100 -> 101 -> 102 crosses runs 1, 5 and 8:
    run 1 holds 100 (what the question asks), run 5 holds 100 and 101, run 8 holds 101 and 102."""
    runs = [(4 * i, 4 * i + 4) for i in range(10)]
    ids = torch.full((40,), COMMON)
    ids[torch.arange(40) % 4 == 1] = torch.arange(10) + 200  # each run's own word: rare but links nothing
    ids[4 + 2], ids[20 + 2], ids[20 + 3], ids[32 + 2], ids[32 + 3] = 100, 100, 101, 101, 102
    scores = torch.full((40,), 0.01)
    scores[4:8] = 1.0  # the question reads run 1
    scores[12:16] = 0.5  # and, less, run 3 (filler)
    return ids, runs, scores


def chosen_runs(mask: torch.Tensor, runs) -> list[int]:
    return [i for i, (a, b) in enumerate(runs) if mask[a:b].all()]


def test_hops_follow_the_chain_that_scores_alone_miss():
    ids, runs, scores = chain_prompt()
    assert chosen_runs(select_spans(scores, runs, 0.3), runs) == [0, 1, 3]  # by score: run 0 wins the tie
    # budget 16 tokens: seeds runs 1 and 3 (half of it), hop 1 -> run 5 (shares 100), hop 2 -> run 8 (101)
    assert chosen_runs(select_with_hops(scores, runs, 0.4, ids, hops=2), runs) == [1, 3, 5, 8]
    assert chosen_runs(select_with_hops(scores, runs, 0.4, ids, hops=1), runs) == [0, 1, 3, 5]  # rest by score


def test_tokens_in_many_runs_link_nothing():
    ids, runs, scores = chain_prompt()
    ids[ids == 101] = COMMON  # the chain's second name is now in every run: no second hop
    ids[torch.arange(40) % 4 == 1] = 300  # nor do the runs' own words, now shared by all
    assert chosen_runs(select_with_hops(scores, runs, 0.4, ids, hops=2), runs) == [0, 1, 3, 5]


def test_budget_and_edge_cases():
    ids, runs, scores = chain_prompt()
    full = select_with_hops(scores, runs, 1.0, ids, hops=3)
    assert full.all()  # every run: the recipe is full at 100%
    assert not select_with_hops(scores, [], 0.5, ids, hops=2).any()
    assert torch.equal(select_with_hops(scores, runs, 0.3, ids, hops=0), select_spans(scores, runs, 0.3))
    for ratio in (0.05, 0.2, 0.5):
        got = int(select_with_hops(scores, runs, ratio, ids, hops=2).sum())
        assert -(-ratio * 40 // 1) <= got < -(-ratio * 40 // 1) + 4  # the budget, plus at most one run's overshoot


def test_hops_change_the_rows_a_partial_link_repairs():
    lm = tiny_lm("qwen2", num_hidden_layers=4)
    segs = linked_prompt(lm, compile_texts(lm))
    plain, hopped = link(lm, segs, "qp-30-k1"), link(lm, segs, "qp-30-k1-h2")
    assert parse_method("qp-30-k1-h2").hops == 2 and parse_method("qp-30-k1-h2").name == "qp-30-k1-h2"
    # the same budget, spent on other runs (or the same ones, if the tiny prompt shares no rare token)
    assert abs(hopped.recomputed - plain.recomputed) <= 16
    assert hopped.logits.shape == plain.logits.shape and torch.isfinite(hopped.logits).all()
