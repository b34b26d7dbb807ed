"""A link run in pieces (the server's chunked link) equals the link run whole (tiny random models)."""

from __future__ import annotations

import pytest
import torch

from ragpic.core.link import ChunkedLink
from ragpic.core.link import link
from prompts import compile_texts, linked_prompt
from tiny import tiny_lm

TOL = 1e-4


def _pieces(lm, segs, method, piece_rows):
    cl = ChunkedLink(lm, segs, method, extra_capacity=4, piece_rows=piece_rows)
    turns = 1
    while not cl.advance():
        turns += 1
    return cl, turns


@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma"])
@pytest.mark.parametrize("method", ["full", "legolink-4"])
def test_pieces_equal_the_whole_link(kind, method):
    extra = {"sliding_window": 24} if kind == "mistral" else {}
    lm = tiny_lm(kind, num_hidden_layers=3, **extra)
    segs = linked_prompt(lm, compile_texts(lm))
    whole = link(lm, segs, method, extra_capacity=4)
    cl, turns = _pieces(lm, segs, method, piece_rows=7)
    got = cl.result
    assert turns == cl.pieces == -(-whole.recomputed // 7) > 2
    assert (got.num_tokens, got.recomputed, got.cache.length) == (whole.num_tokens, whole.recomputed, whole.num_tokens)
    assert (got.logits - whole.logits).abs().max() <= TOL
    n = whole.num_tokens
    for a, b in ((got.cache.key_slab, whole.cache.key_slab), (got.cache.value_slab, whole.cache.value_slab)):
        assert (a[..., :n, :] - b[..., :n, :]).abs().max() <= TOL
    # the pieces really are pieces: stopping after the first leaves the last rows unwritten
    partial = ChunkedLink(lm, segs, method, extra_capacity=4, piece_rows=7)
    assert partial.advance() is False and partial.result is None and partial.done_pieces == 1


def test_a_link_that_fits_one_piece_is_the_plain_link_bit_for_bit():
    lm = tiny_lm("llama", num_hidden_layers=2)
    segs = linked_prompt(lm, compile_texts(lm))
    whole = link(lm, segs, "legolink-4")
    cl, turns = _pieces(lm, segs, "legolink-4", piece_rows=whole.recomputed)
    assert turns == 1 and torch.equal(cl.result.logits, whole.logits)
    cl, turns = _pieces(lm, segs, "cacheblend-15", piece_rows=3)  # CacheBlend selects over the whole prompt
    assert turns == 1 and torch.equal(cl.result.logits, link(lm, segs, "cacheblend-15").logits)


def test_bad_input_raises_before_any_model_work():
    lm = tiny_lm("llama", num_hidden_layers=2)
    segs = linked_prompt(lm, compile_texts(lm))
    with pytest.raises(ValueError, match="piece_rows"):
        ChunkedLink(lm, segs, "full", piece_rows=0)
    with pytest.raises(ValueError, match="context window"):
        ChunkedLink(lm, segs, "full", extra_capacity=10 ** 6, piece_rows=8)
