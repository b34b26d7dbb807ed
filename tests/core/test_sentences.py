"""Sentence runs (``-s``, :mod:`ragpic.core.link.sentences`) on raw tensors and a tiny model (their
exactness at a 100% budget is tested beside qr's and qp's, tests/core/test_query_guided.py)."""

from __future__ import annotations

import torch

from ragpic.core.link import link
from ragpic.core.link.hops import select_with_hops
from ragpic.core.link.query_guided import chunk_spans
from ragpic.core.link.sentences import MAX_RUN, sentence_ends, sentence_spans
from ragpic.core.segments import Segment, concat_ids
from prompts import compile_texts, linked_prompt
from recipes import parse_method
from tiny import tiny_lm, tiny_tokenizer


def text(n: int) -> Segment:
    return Segment(torch.arange(n))


def chunk(n: int) -> Segment:
    """A chunk by its length alone: runs read only where chunks sit (any KV marks one)."""
    return Segment(torch.arange(n), kv=object())


def ends_at(n: int, *marks: int) -> torch.Tensor:
    ends = torch.zeros(n, dtype=torch.bool)
    ends[list(marks)] = True
    return ends


def test_runs_close_after_a_mark_once_long_enough_and_never_grow_past_the_cap():
    segs = [text(4), chunk(60), text(3)]  # the chunk holds positions 4..63
    # marks at 6 (3 tokens in: too short, joins the next), 14, 20 (6 tokens after 14: joins), 30
    runs = sentence_spans(segs, ends_at(67, 6, 14, 20, 30), min_run=8, max_run=32)
    assert runs == [(4, 15), (15, 31), (31, 63), (63, 64)]
    assert all(b - a <= MAX_RUN for a, b in runs)


def test_runs_cover_exactly_the_tokens_plain_runs_do():
    """Same tokens, so a budget buys as many rows; a chunk at position 0 has none (its KV is full's)."""
    segs = [chunk(40), text(5), chunk(50), chunk(33), text(7)]
    ends = ends_at(135, 10, 50, 51, 70, 100, 101, 102, 120)
    cover = torch.zeros(135, dtype=torch.bool)
    for a, b in sentence_spans(segs, ends):
        assert not cover[a:b].any()
        cover[a:b] = True
    plain = torch.zeros(135, dtype=torch.bool)
    for a, b in chunk_spans(segs):
        plain[a:b] = True
    assert torch.equal(cover, plain) and not cover[:45].any()


def test_marks_are_read_from_the_prompts_own_tokens():
    tok = tiny_tokenizer()
    ids = torch.tensor(tok("the quick brown fox. a needle hides?\nanswer", add_special_tokens=False)["input_ids"])
    ends = sentence_ends(tok, ids)
    pieces = [tok.decode([int(t)]) for t in ids]
    assert ends.tolist() == [any(c in ".?\n" for c in p) for p in pieces]
    assert ends.sum() >= 2  # the stop and the question mark (or a newline merged with it)


def test_a_question_word_takes_the_sentence_that_holds_it_whole():
    """The key sits mid-sentence: a 16-token window around it stops short of the value at the
    sentence's end; with whole runs the window is the sentence."""
    ids = 1000 + torch.arange(160) % 8
    ids[60:62] = torch.tensor((200, 210))  # the key, in the sentence 52..75 (its value at 70..74)
    ends = ends_at(160, 15, 31, 51, 75, 99, 120, 140)
    segs = [text(4), chunk(156)]
    runs = sentence_spans(segs, ends)
    assert (52, 76) in runs
    scores = torch.full((160,), 0.01)
    scores[100:121] = 1.0  # the question reads elsewhere
    question = [200, 210]
    window = select_with_hops(scores, chunk_spans(segs), 0.2, ids, hops=0, question=question)
    assert not window[70:75].all()  # the value is cut off
    whole = select_with_hops(scores, runs, 0.3, ids, hops=0, question=question, whole_runs=True)
    assert whole[52:76].all()


def test_the_suffix_parses_names_and_repairs_other_rows_on_a_tiny_model():
    m = parse_method("qr-4-k4-h1-w-s-t4")
    assert m.sentences and m.words and m.tail == 4 and m.name == "qr-4-k4-h1-w-s-t4"
    assert not parse_method("qr-4-k4-h1-w").sentences and parse_method("qp-5-k1-s").name == "qp-5-k1-s"
    lm = tiny_lm("qwen2", num_hidden_layers=3)
    segs = linked_prompt(lm, compile_texts(lm))
    ids = concat_ids(segs)
    assert sentence_spans(segs, sentence_ends(lm.tokenizer, ids)) != chunk_spans(segs)
    plain, sentences = link(lm, segs, "qr-40-k1-h1-w"), link(lm, segs, "qr-40-k1-h1-w-s")
    assert plain.recomputed > 0 and sentences.recomputed > 0
    assert not torch.equal(plain.logits, sentences.logits)
