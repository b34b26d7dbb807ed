"""Exactness of compile + link on tiny random models: the maths says these must match."""

from __future__ import annotations

import pytest
import torch

from ragpic.core.link import link, recompute_mask
from ragpic.core.kv import rotate_keys
from ragpic.core.segments import Segment, chunk_segment, text_segment
from prompts import CHUNKS, compile_texts, linked_prompt
from recipes import parse_method
from tiny import tiny_lm

TOL = 1e-4
ARCHS = [("llama", "sdpa"), ("llama", "eager"), ("qwen2", "sdpa"), ("mistral", "sdpa"),
         ("qwen3", "sdpa"), ("gemma", "sdpa")]


def _rows(res):
    n = res.num_tokens
    return res.cache.key_slab[:, :, :, :n], res.cache.value_slab[:, :, :, :n]


@pytest.mark.parametrize("kind,attn", ARCHS)
def test_legolink_covering_every_chunk_equals_full(kind, attn):
    lm = tiny_lm(kind, attn=attn, num_hidden_layers=3)  # 4 query heads, 2 KV heads: GQA
    segs = linked_prompt(lm, compile_texts(lm))
    full = link(lm, segs, "full")
    linked = link(lm, segs, "legolink-1000")
    assert linked.recomputed == full.num_tokens
    assert (full.logits - linked.logits).abs().max() <= TOL
    for a, b in zip(_rows(full), _rows(linked)):
        assert (a - b).abs().max() <= TOL
    # and the approximation really is one: naive is far from full on the same tokens
    assert (full.logits - link(lm, segs, "naive").logits).abs().max() > 100 * TOL


def test_naive_is_exact_for_a_chunk_at_position_zero():
    """A chunk at position 0 is where it was compiled: its cached KV is the full KV."""
    lm = tiny_lm("llama", num_hidden_layers=3)
    kv = compile_texts(lm, CHUNKS[:1])[0]
    segs = [chunk_segment(kv), text_segment(lm.tokenizer, " question: what did the fox do?")]
    full, naive = link(lm, segs, "full"), link(lm, segs, "naive")
    assert naive.recomputed == segs[1].num_tokens
    assert (full.logits - naive.logits).abs().max() <= TOL
    for a, b in zip(_rows(full), _rows(naive)):
        assert (a - b).abs().max() <= TOL


@pytest.mark.parametrize("rope", [None, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 256,
                                          "rope_theta": 10000.0},
                                  {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}])
def test_rerotated_keys_equal_keys_computed_at_global_positions(rope):
    """Layer-0 keys depend only on (token, position): moving them must match recomputing them."""
    overrides = {"rope_parameters": rope} if rope else {}
    lm = tiny_lm("llama", **overrides)
    kv = compile_texts(lm, CHUNKS[1:2])[0]
    offset = 700
    ids = torch.cat((torch.zeros(offset, dtype=torch.long), kv.token_ids))
    full = link(lm, [_ids_segment(ids)], "full")
    at_global = full.cache.key_slab[0, 0, :, offset:offset + kv.num_tokens]
    moved = rotate_keys(kv.keys[0], offset, lm.inv_freq)
    assert (moved - at_global).abs().max() <= TOL
    assert (kv.keys[0] - at_global).abs().max() > 100 * TOL  # unrotated keys are wrong there
    # link's own fill rotates straight into the cache rows: the same keys land there
    naive = link(lm, [_ids_segment(ids[:offset]), chunk_segment(kv)], "naive")
    assert (naive.cache.key_slab[0, 0, :, offset:offset + kv.num_tokens] - at_global).abs().max() <= TOL


@pytest.mark.parametrize("rotary_pairs", [8, 5])  # 5 of 8 pairs: partial rotary, the rest passes through
def test_rotating_into_a_buffer_equals_rotating_out_of_place(rotary_pairs):
    inv_freq = 1.0 / (10000 ** (torch.arange(rotary_pairs, dtype=torch.float32) / rotary_pairs))
    keys = torch.randn(3, 2, 9, 16)
    delta = torch.arange(9) * 7 + 100
    ref = rotate_keys(keys, delta, inv_freq)
    buf = torch.full((3, 2, 20, 16), float("nan"))[:, :, 4:13]  # a strided view, like cache rows
    assert rotate_keys(keys, delta, inv_freq, out=buf) is buf
    assert (buf - ref).abs().max() <= 1e-6
    assert torch.equal(buf[..., 2 * rotary_pairs:], keys[..., 2 * rotary_pairs:])
    assert not torch.allclose(ref, keys, atol=1e-2)


def _ids_segment(ids):
    return Segment(token_ids=ids)


def test_rotation_composes_and_inverts():
    lm = tiny_lm("llama")
    keys = torch.randn(2, 2, 5, 16)
    assert torch.allclose(rotate_keys(rotate_keys(keys, 37, lm.inv_freq), -37, lm.inv_freq), keys, atol=1e-5)
    step = rotate_keys(rotate_keys(keys, 10, lm.inv_freq), 27, lm.inv_freq)
    assert torch.allclose(step, rotate_keys(keys, 37, lm.inv_freq), atol=1e-5)


def test_mistral_sliding_window_is_honoured():
    lm = tiny_lm("mistral", sliding_window=16, num_hidden_layers=3)
    segs = linked_prompt(lm, compile_texts(lm))
    assert sum(s.num_tokens for s in segs) > 2 * 16
    full, linked = link(lm, segs, "full"), link(lm, segs, "legolink-1000")
    assert (full.logits - linked.logits).abs().max() <= TOL


@pytest.mark.parametrize("kind,attn", ARCHS)
def test_cacheblend_full_ratio_equals_full_and_partial_ratio_sits_between(kind, attn):
    lm = tiny_lm(kind, attn=attn, num_hidden_layers=4)
    segs = linked_prompt(lm, compile_texts(lm))
    full = link(lm, segs, "full")
    assert (link(lm, segs, "cacheblend-100").logits - full.logits).abs().max() <= TOL
    cb = link(lm, segs, "cacheblend-15")
    must = int(recompute_mask(segs, parse_method("naive")).sum())
    chunk_tokens = sum(s.num_tokens for s in segs if s.is_chunk)
    assert cb.recomputed == must + -(-15 * chunk_tokens // 100)


def test_legolink_k_recomputes_first_k_tokens_of_every_chunk_not_at_zero():
    lm = tiny_lm("llama")
    segs = linked_prompt(lm, compile_texts(lm))
    mask = recompute_mask(segs, parse_method("legolink-2"))
    text_tokens = sum(s.num_tokens for s in segs if not s.is_chunk)
    assert int(mask.sum()) == text_tokens + 2 * 3
    no_prefix = linked_prompt(lm, compile_texts(lm), head=None)  # first chunk starts at 0: exact
    mask = recompute_mask(no_prefix, parse_method("legolink-2"))
    assert not mask[:2].any() and int(mask.sum()) == text_tokens - segs[0].num_tokens + 2 * 2


def test_legolink0_uses_dummy_rows_and_links():
    lm = tiny_lm("llama")
    kvs = compile_texts(lm, recipe="bos4")
    assert all(kv.base_position == 4 and kv.recipe == "bos4" for kv in kvs)
    res = link(lm, linked_prompt(lm, kvs), "legolink-0")
    assert torch.isfinite(res.logits).all()


def test_batched_compile_equals_compiling_each_chunk_alone():
    lm = tiny_lm("qwen2")
    together = compile_texts(lm)
    for text, kv in zip(CHUNKS, together):
        alone = compile_texts(lm, [text])[0]
        assert torch.equal(alone.token_ids, kv.token_ids)
        assert (alone.keys - kv.keys).abs().max() <= 1e-5
        assert (alone.values - kv.values).abs().max() <= 1e-5


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_linking_every_row_equals_full_under_quantized_weights(fmt):
    """Linking is orthogonal to the weights: under int8/int4 layers a 100% link still equals
    ``full`` of the same weights, and greedy decode from both gives the same tokens."""
    from ragpic.core.decode import Sampling, decode_tokens
    from ragpic.core.weights import WeightFormat
    from ragpic.core.weights.apply import quantize_model

    lm = tiny_lm("qwen2", num_hidden_layers=3, num_key_value_heads=4)  # every projection fits int4's blocks
    report = quantize_model(lm.model, WeightFormat(fmt))
    assert report.kinds.get(fmt, 0) >= 3 * 7
    segs = linked_prompt(lm, compile_texts(lm))
    full = link(lm, segs, "full", extra_capacity=8)
    linked = link(lm, segs, "legolink-1000", extra_capacity=8)
    assert (full.logits - linked.logits).abs().max() <= TOL
    lm.model.generation_config.eos_token_id = None  # eight tokens, whatever they are
    tokens = [list(decode_tokens(lm, r.cache, r.logits, r.num_tokens, Sampling(max_new_tokens=8))) for r in (full, linked)]
    assert tokens[0] == tokens[1] and len(tokens[0]) == 8
