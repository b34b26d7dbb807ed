"""Recipe ``prior`` and the ``prior-<r>`` methods on tiny random models and raw tensors: the
prior measured at compile, the rows it picks, exactness at a 100% budget, pieces."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from ragpic.core.compile import ChunkInParts, compile_chunks
from ragpic.core.link import ChunkedLink, link, recompute_mask
from ragpic.core.link.prior_rows import prior_rows
from ragpic.core.methods import parse_method
from ragpic.core.prior import context_ids, value_deviation
from ragpic.core.segments import segment_starts
from ragpic.errors import LinkError
from prompts import CHUNKS, compile_texts, linked_prompt
from test_link_exact import ARCHS, TOL
from tiny import tiny_lm


@pytest.mark.parametrize("kind,attn", ARCHS)
def test_full_budget_equals_full(kind, attn):
    lm = tiny_lm(kind, attn=attn, num_hidden_layers=3)
    segs = linked_prompt(lm, compile_texts(lm, recipe="prior"))
    full, linked = link(lm, segs, "full"), link(lm, segs, "prior-100")
    n = full.num_tokens
    assert linked.recomputed == n
    assert (full.logits - linked.logits).abs().max() <= TOL
    for a, b in ((full.cache.key_slab, linked.cache.key_slab), (full.cache.value_slab, linked.cache.value_slab)):
        assert (a[..., :n, :] - b[..., :n, :]).abs().max() <= TOL
    assert (full.logits - link(lm, segs, "prior-10").logits).abs().max() > 100 * TOL  # an approximation below


def test_prior_recipe_keeps_plain_kv_and_measures_the_values_behind_the_context():
    lm = tiny_lm("qwen2", num_hidden_layers=3)
    plain, prior = compile_texts(lm), compile_texts(lm, recipe="prior")
    context = context_ids(lm)
    assert context.numel() > 20
    for text, a, b in zip(CHUNKS, plain, prior):
        assert b.recipe == "prior" and a.prior is None and b.prior.dtype == torch.float32
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        # the same values measured another way: the context and the chunk compiled as one chunk
        behind = compile_chunks(lm, [torch.cat((context, a.token_ids))])[0].values[:, :, context.numel():]
        assert torch.allclose(b.prior, value_deviation(a.values, behind), rtol=1e-4, atol=1e-6)
        assert b.prior.shape == (a.num_tokens,) and (b.prior >= 0).all() and b.prior.max() > 0


def test_a_chunk_compiled_in_parts_has_the_prior_compiled_whole():
    lm = tiny_lm("llama", num_hidden_layers=3)
    whole = compile_texts(lm, CHUNKS[:1], recipe="prior")[0]
    parts = ChunkInParts(lm, whole.token_ids, "prior")
    assert parts.run(5) is None
    kv = parts.run(parts.rows)
    assert (kv.prior - whole.prior).abs().max() <= 1e-5 * max(1.0, float(whole.prior.max()))


def test_value_deviation_is_zero_for_unmoved_values_and_scaled_per_layer():
    plain = torch.randn(2, 2, 5, 4)
    assert torch.equal(value_deviation(plain, plain), torch.zeros(5))
    moved = plain.clone()
    moved[0, :, 3] += 1.0
    moved[1] = plain[1] * 1.0
    dev = value_deviation(plain, moved)
    assert int(dev.argmax()) == 3 and (dev[[0, 1, 2, 4]] == 0).all()
    # scaling a layer's values scales its distances and its norm alike: the prior is unchanged
    big = torch.stack((plain[0] * 1000, plain[1]))
    big_moved = torch.stack((moved[0] * 1000, moved[1]))
    assert torch.allclose(value_deviation(big, big_moved), dev, rtol=1e-4)


def test_prior_rows_takes_the_highest_unfixed_tokens():
    prior = torch.tensor([9.0, 1.0, 5.0, 5.0, 0.0, 7.0])
    fixed = torch.tensor([True, False, False, False, False, False])
    # ceil(0.34 * 6) = 3 tokens beside the fixed one: 7.0 and the two 5.0s (ties to the earlier)
    assert prior_rows(prior, fixed, 0.34).tolist() == [True, False, True, True, False, True]
    assert prior_rows(prior, fixed, 0.2).tolist() == [True, False, True, False, False, True]
    assert prior_rows(prior, fixed, 1.0).all()  # capped at the free tokens


def test_mask_is_legolinks_rows_plus_r_of_each_chunk_after_position_zero():
    lm = tiny_lm("llama", num_hidden_layers=3)
    segs = linked_prompt(lm, compile_texts(lm, recipe="prior"))
    base = recompute_mask(segs, parse_method("legolink-2"))
    mask = recompute_mask(segs, parse_method("prior-30-k2"))
    assert (mask & base).equal(base)
    for seg, start in zip(segs, segment_starts(segs)):
        if seg.is_chunk:
            added = mask[start:start + seg.num_tokens] & ~base[start:start + seg.num_tokens]
            assert int(added.sum()) == -(-30 * seg.num_tokens // 100)
            chosen, rest = seg.kv.prior[added], seg.kv.prior[~mask[start:start + seg.num_tokens]]
            assert rest.numel() == 0 or chosen.min() >= rest.max()


def test_runs_in_pieces_as_it_runs_whole():
    lm = tiny_lm("llama", num_hidden_layers=3)
    segs = linked_prompt(lm, compile_texts(lm, recipe="prior"))
    whole = link(lm, segs, "prior-20")
    piecewise = ChunkedLink(lm, segs, "prior-20", piece_rows=7)
    while not piecewise.advance():
        pass
    assert piecewise.result.recomputed == whole.recomputed
    assert (piecewise.result.logits - whole.logits).abs().max() <= TOL


def test_a_chunk_without_its_prior_is_refused_by_name():
    lm = tiny_lm("llama", num_hidden_layers=3)
    plain = compile_texts(lm)
    with pytest.raises(LinkError, match="recipe 'plain' but prior-10 needs 'prior'"):
        link(lm, linked_prompt(lm, plain), "prior-10")
    relabelled = [replace(kv, recipe="prior") for kv in plain]
    with pytest.raises(LinkError, match="segment 1 has no prior"):
        link(lm, linked_prompt(lm, relabelled), "prior-10")
