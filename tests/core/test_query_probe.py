"""One-pass query-guided recompute (``qp-<r>``) on tiny random models (its exactness at a 100%
budget is tested beside ``qr``'s, tests/core/test_query_guided.py)."""

from __future__ import annotations

import pytest
import torch

from ragpic.core.link import ChunkedLink, link, linker_for, recompute_mask
from ragpic.core.link.plan import fill_cached_rows, new_cache
from ragpic.core.link.query_guided import chunk_spans
from ragpic.core.link.query_probe import PROFILED_LAYERS, probe_layers, shallow_pass
from ragpic.core.ops.attention_probe import AttentionProbe
from ragpic.core.segments import concat_ids
from ragpic.errors import ConfigError, LinkError
from prompts import compile_texts, linked_prompt
from recipes import parse_method
from tiny import tiny_lm

TOL = 1e-4


def test_partial_budget_adds_whole_runs_to_legolinks_rows_in_one_forward():
    lm = tiny_lm("llama", num_hidden_layers=4)
    segs = linked_prompt(lm, compile_texts(lm))
    fixed = recompute_mask(segs, parse_method("qp-30-k1"))
    assert torch.equal(fixed, recompute_mask(segs, parse_method("legolink-1")))
    res = link(lm, segs, "qp-30-k1")
    chunk_tokens = sum(s.num_tokens for s in segs if s.is_chunk)
    added = res.recomputed - 2 * int(fixed.sum())  # probe pass + forward: the fixed rows twice
    assert -(-30 * chunk_tokens // 100) <= added < chunk_tokens
    assert (res.logits - link(lm, segs, "legolink-1").logits).abs().max() > 100 * TOL
    job = ChunkedLink(lm, segs, "qp-30-k1", piece_rows=4)
    assert job.pieces == 1 and job.advance()
    assert torch.equal(job.result.logits, res.logits)


@torch.inference_mode()
def test_the_added_rows_are_whole_runs_of_the_chunks():
    lm = tiny_lm("qwen2", num_hidden_layers=4)
    segs = linked_prompt(lm, compile_texts(lm))
    linker = linker_for("qp-20-k1")
    ids, n = concat_ids(segs), sum(s.num_tokens for s in segs)
    rec = linker.recompute(segs)
    cache = new_cache(lm, n)
    fill_cached_rows(lm, cache, segs)
    _, chosen, _ = linker.run_whole(lm, segs, ids, rec, cache)
    assert torch.equal(chosen & rec, rec)  # legolink-k's rows stay
    added = chosen & ~rec
    for a, b in chunk_spans(segs):  # a run is taken whole or not at all (rows of rec aside)
        part = added[a:b][~rec[a:b]]
        assert part.all() or not part.any(), (a, b)


@torch.inference_mode()
def test_shallow_pass_writes_the_first_layers_as_the_whole_forward_does():
    lm = tiny_lm("mistral", num_hidden_layers=4)
    segs = linked_prompt(lm, compile_texts(lm))
    ids, n = concat_ids(segs), sum(s.num_tokens for s in segs)
    rows = recompute_mask(segs, parse_method("legolink-2")).nonzero().squeeze(1)
    whole = link(lm, segs, "legolink-2").cache
    cache = new_cache(lm, n)
    fill_cached_rows(lm, cache, segs)
    probe = AttentionProbe(rows=3)
    shallow_pass(lm, cache, ids, rows, n, 2, probe)
    assert len(probe.layers) == 2 and all(p.shape == (n,) for p in probe.layers)
    for slab_a, slab_b in ((whole.key_slab, cache.key_slab), (whole.value_slab, cache.value_slab)):
        assert (slab_a[:2, ..., :n, :] - slab_b[:2, ..., :n, :]).abs().max() <= TOL
        # the deeper layers of those rows are still the cached (stale) KV or unwritten
        assert (slab_a[2:, :, :, rows[-1]] - slab_b[2:, :, :, rows[-1]]).abs().max() > TOL


def test_probe_depth_bounds():
    assert probe_layers(24, 0.5) == 12 and probe_layers(28, 0.5) == 14
    assert probe_layers(3, 0.5) == PROFILED_LAYERS and probe_layers(1, 0.5) == 1
    assert probe_layers(30, 0.25) == 8


def test_names_parse_and_bad_ones_say_what_to_write():
    m = parse_method("qp-3")
    assert (m.name, m.k, m.ratio, m.depth) == ("qp-3", 16, 0.03, 0.5)
    assert parse_method("QP-2.5-k4").name == "qp-2.5-k4"
    m = parse_method("qp-5-k4-d25")
    assert (m.name, m.k, m.ratio, m.depth) == ("qp-5-k4-d25", 4, 0.05, 0.25) and parse_method(m.name) == m
    assert parse_method("qp-5-d50") == parse_method("qp-5") and parse_method("qr-5").depth == 0
    for bad in ("qp", "qp-0", "qp-101", "qp-3-kx", "qp-3-d0", "qp-3-d101", "qp-3-d", "qr-3-d25"):
        with pytest.raises(ConfigError, match="qp-<percent>"):
            parse_method(bad)


def test_a_model_off_ragpic_attention_gets_a_clear_error():
    lm = tiny_lm("llama", attn="eager", banded=False)
    segs = linked_prompt(lm, compile_texts(lm))
    with pytest.raises(LinkError, match="qp-5.*ragpic's attention.*load_model"):
        link(lm, segs, "qp-5")
