"""Second-order selection (``-h<n>``, :mod:`ragpic.core.link.hops`) on raw tensors and tiny models
(its exactness at a 100% budget is tested beside qr's and qp's, tests/core/test_query_guided.py)."""

from __future__ import annotations

import torch

from ragpic.core.link import link
from ragpic.core.link.hops import select_with_hops
from ragpic.core.link.query_guided import select_spans
from prompts import compile_texts, linked_prompt
from recipes import parse_method
from tiny import tiny_lm


def chain_prompt() -> tuple[torch.Tensor, list[tuple[int, int]], torch.Tensor]:
    """Twenty 16-token runs of filler (8 tokens, each in every run); a chain of two-token names
    A = (100, 110) -> B = (101, 111) -> C = (102, 112): A in run 1 (what the question asks) and
    at 134, B at 136 and 237, C at 241, so the last link straddles runs 14 and 15."""
    runs = [(16 * i, 16 * i + 16) for i in range(20)]
    ids = 1000 + torch.arange(320) % 8
    for at, name in ((20, (100, 110)), (134, (100, 110)), (136, (101, 111)), (237, (101, 111)), (241, (102, 112))):
        ids[at:at + 2] = torch.tensor(name)
    scores = torch.full((320,), 0.01)
    scores[16:32] = 1.0  # the question reads run 1
    scores[48:64] = 0.5  # and, less, run 3 (filler)
    return ids, runs, scores


def rows(*spans: tuple[int, int]) -> torch.Tensor:
    mask = torch.zeros(320, dtype=torch.bool)
    for a, b in spans:
        mask[a:b] = True
    return mask


def test_hops_follow_the_chain_that_scores_alone_miss():
    ids, runs, scores = chain_prompt()
    assert torch.equal(select_spans(scores, runs, 0.2), rows((0, 64)))  # by score: runs 1, 3, then 0 and 2
    # budget 64: seeds runs 1 and 3 (half), hop 1 -> a window around 134 (A), hop 2 -> around 237 (B),
    # which keeps the link that straddles runs 14 and 15 whole
    assert torch.equal(select_with_hops(scores, runs, 0.2, ids, hops=2), rows((16, 32), (48, 64), (126, 142), (229, 245)))
    # one hop: the rest by score (run 0)
    assert torch.equal(select_with_hops(scores, runs, 0.2, ids, hops=1), rows((0, 32), (48, 64), (126, 142)))


def test_tokens_in_many_runs_or_one_shared_token_link_nothing():
    ids, runs, scores = chain_prompt()
    common = ids.clone()
    common[torch.arange(320) % 16 == 14], common[torch.arange(320) % 16 == 15] = 101, 111  # B is in every run
    assert torch.equal(select_with_hops(scores, runs, 0.2, common, hops=2), rows((0, 32), (48, 64), (126, 142)))
    chance = ids.clone()
    chance[137] = 1000 + 137 % 8  # B's second token gone: one shared rare token (101) is chance, not a link
    assert torch.equal(select_with_hops(scores, runs, 0.2, chance, hops=2), rows((0, 32), (48, 64), (126, 142)))


def test_budget_and_edge_cases():
    ids, runs, scores = chain_prompt()
    assert select_with_hops(scores, runs, 1.0, ids, hops=3).all()  # every run: the recipe is full at 100%
    assert not select_with_hops(scores, [], 0.5, ids, hops=2).any()
    assert torch.equal(select_with_hops(scores, runs, 0.3, ids, hops=0), select_spans(scores, runs, 0.3))
    for ratio in (0.01, 0.1, 0.2, 0.5):
        budget = -(-ratio * 320 // 1)
        got = int(select_with_hops(scores, runs, ratio, ids, hops=2).sum())
        assert budget <= got < budget + 16  # the budget, plus at most one run's or window's overshoot


def test_hops_change_the_rows_a_partial_link_repairs():
    lm = tiny_lm("qwen2", num_hidden_layers=4)
    segs = linked_prompt(lm, compile_texts(lm))
    plain, hopped = link(lm, segs, "qp-30-k1"), link(lm, segs, "qp-30-k1-h2")
    assert parse_method("qp-30-k1-h2").hops == 2 and parse_method("qp-30-k1-h2").name == "qp-30-k1-h2"
    # the same budget, spent on other runs (or the same ones, if the tiny prompt shares no rare token)
    assert abs(hopped.recomputed - plain.recomputed) <= 16
    assert hopped.logits.shape == plain.logits.shape and torch.isfinite(hopped.logits).all()


def test_the_questions_rare_words_pick_the_runs_that_name_them():
    """-w: a key the question names (two tokens, in runs 5, 9 and 17) is repaired where the
    question's attention missed it; a word in more than QUESTION_RUNS runs picks nothing."""
    ids, runs, scores = chain_prompt()
    for at in (84, 148, 276):
        ids[at:at + 2] = torch.tensor((200, 210))
    scores[142] = 0.2  # the question reads run 8 a little: of the key's windows, the one at 148 holds it
    question = [200, 210, 1000]  # 1000: a filler token, in every run
    by_score = select_with_hops(scores, runs, 0.15, ids, hops=0)
    assert torch.equal(by_score, rows((16, 32), (48, 64), (128, 144)))  # runs 1, 3 and 8: the key nowhere
    # budget 48: the seeds take runs 1 and 3 (half, rounded up to whole runs), then one window on the key
    assert torch.equal(select_with_hops(scores, runs, 0.15, ids, hops=0, question=question),
                       rows((16, 32), (48, 64), (140, 156)))
    everywhere = ids.clone()
    for at in (100, 180, 212):  # the key in six runs now: a common word, not a name
        everywhere[at:at + 2] = torch.tensor((200, 210))
    assert torch.equal(select_with_hops(scores, runs, 0.15, everywhere, hops=0, question=question), by_score)
    assert parse_method("qr-5-k4-h1-w-t4").words and not parse_method("qr-5-k4-h1-t4").words
