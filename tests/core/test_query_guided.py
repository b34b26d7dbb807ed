"""Query-guided recompute (``qr-<r>``; ``qp-<r>``'s exactness too) on tiny random models and raw tensors."""

from __future__ import annotations

import pytest
import torch

from ragpic.core.link.plan import new_cache
from ragpic.core.link import ChunkedLink
from ragpic.core.runner import recompute_rows
from ragpic.core.link import link, recompute_mask
from ragpic.core.ops.attention_probe import AttentionProbe
from ragpic.core.link.query_guided import chunk_spans, select_spans, trailing_text_rows
from ragpic.errors import ConfigError, LinkError
from prompts import compile_texts, linked_prompt
from recipes import parse_method
from tiny import tiny_lm

TOL = 1e-4
KINDS = ["llama", "qwen2", "mistral", "qwen3", "gemma"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("method", ["qr-100", "qr-100-k0", "qp-100", "qp-100-k0", "qp-100-d75", "qr-100-h2", "qp-100-h2",
                                    "qr-100-k4-h1-t2", "qr-100-k4-h1-w-t2", "qp-100-k1-w",
                                    "qr-100-k4-h1-w-s-t2", "qp-100-k1-w-s"])
def test_full_budget_equals_full(kind, method):
    """Both query-driven methods (qp-100-d75 probes 3 of the 4 layers, the default 2): qp's probe
    pass wrote layers 0..P-1 first and its forward rewrote every one of their rows."""
    lm = tiny_lm(kind, num_hidden_layers=4)
    segs = linked_prompt(lm, compile_texts(lm))
    full, linked = link(lm, segs, "full"), link(lm, segs, method)
    n = full.num_tokens
    assert (full.logits - linked.logits).abs().max() <= TOL
    for a, b in ((full.cache.key_slab, linked.cache.key_slab), (full.cache.value_slab, linked.cache.value_slab)):
        assert (a[..., :n, :] - b[..., :n, :]).abs().max() <= TOL
    # the approximation it starts from is one: its legolink-k rows alone are far from full
    first = "naive" if method.endswith("-k0") else "legolink-16"
    assert (full.logits - link(lm, segs, first).logits).abs().max() > 100 * TOL


def test_partial_budget_recomputes_the_chosen_runs_then_the_question():
    lm = tiny_lm("llama", num_hidden_layers=3)
    segs = linked_prompt(lm, compile_texts(lm))
    first = recompute_mask(segs, parse_method("qr-30-k1"))
    assert torch.equal(first, recompute_mask(segs, parse_method("legolink-1")))
    res = link(lm, segs, "qr-30-k1")
    chunk_tokens = sum(s.num_tokens for s in segs if s.is_chunk)
    tail = trailing_text_rows(segs)
    assert tail == segs[-1].num_tokens
    # second pass: >= 30% of chunk tokens (whole runs) plus at least the question again
    assert res.recomputed >= int(first.sum()) + -(-30 * chunk_tokens // 100) + tail
    assert res.recomputed < int(first.sum()) + chunk_tokens + tail + 2  # not everything
    assert (res.logits - link(lm, segs, "legolink-1").logits).abs().max() > 100 * TOL


def test_tail_recomputes_only_the_questions_last_rows_in_the_second_pass():
    """qr-<r>-t<m>: the same runs as qr-<r> (same first pass, same probe); the question's rows
    before its last m keep the first pass's KV, which is legolink-k's, bit for bit."""
    lm = tiny_lm("llama", num_hidden_layers=3)
    segs = linked_prompt(lm, compile_texts(lm))
    n, tail = sum(s.num_tokens for s in segs), trailing_text_rows(segs)
    assert tail > 3
    whole, cut, first = link(lm, segs, "qr-30-k1"), link(lm, segs, "qr-30-k1-t2"), link(lm, segs, "legolink-1")
    assert cut.recomputed == whole.recomputed - (tail - 2)
    kept = slice(n - tail, n - 2)
    for a, b in ((first.cache.key_slab, cut.cache.key_slab), (first.cache.value_slab, cut.cache.value_slab)):
        assert torch.equal(a[..., kept, :], b[..., kept, :])
    assert not torch.equal(whole.cache.key_slab[..., kept, :], cut.cache.key_slab[..., kept, :])
    assert (cut.logits - whole.logits).abs().max() > 0
    m = parse_method("qr-6-k4-h1-t8")
    assert (m.name, m.k, m.ratio, m.hops, m.tail) == ("qr-6-k4-h1-t8", 4, 0.06, 1, 8) and parse_method(m.name) == m
    for bad in ("qr-5-t0", "qp-5-t8", "qr-5-t", "qr-5-t8-h1"):
        with pytest.raises(ConfigError, match="qr-<percent>"):
            parse_method(bad)


def test_select_spans_takes_best_runs_until_the_budget_is_covered():
    scores = torch.zeros(20)
    scores[12] = 5.0  # run (11, 15)
    scores[3] = 2.0   # run (3, 7)
    runs = [(3, 7), (7, 11), (11, 15), (15, 17)]  # 14 run tokens
    chosen = select_spans(scores, runs, 0.2)  # budget ceil(2.8) = 3 tokens: one run
    assert chosen.nonzero().squeeze(1).tolist() == [11, 12, 13, 14]
    chosen = select_spans(scores, runs, 0.5)  # 7 tokens: two runs
    assert chosen.nonzero().squeeze(1).tolist() == [3, 4, 5, 6, 11, 12, 13, 14]
    assert int(select_spans(scores, runs, 1.0).sum()) == 14
    assert not select_spans(scores, [], 0.5).any()


def test_chunk_spans_start_at_every_chunk_and_stop_at_its_end():
    lm = tiny_lm("llama")
    segs = linked_prompt(lm, compile_texts(lm))
    runs = chunk_spans(segs, span=4)
    covered = torch.zeros(sum(s.num_tokens for s in segs), dtype=torch.bool)
    for a, b in runs:
        assert 0 < b - a <= 4 and not covered[a:b].any()
        covered[a:b] = True
    chunks = ~recompute_mask(segs, parse_method("naive"))
    assert torch.equal(covered, chunks)


def test_probe_records_the_softmax_of_the_last_rows_under_gqa_and_a_mask():
    torch.manual_seed(0)
    h, kv, r, n, d = 4, 2, 5, 9, 8
    q, k = torch.randn(1, h, r, d), torch.randn(1, kv, n, d)
    mask = torch.zeros(1, 1, r, n)
    mask[..., -1] = torch.finfo(torch.float32).min  # nobody sees the last key
    probe = AttentionProbe(rows=2)
    probe.record(q, k, mask, 0.3)
    keys = k.repeat_interleave(h // kv, dim=1)  # transformers' repeat_kv layout
    want = ((q[:, :, -2:] @ keys.transpose(-1, -2)) * 0.3 + mask[:, :, -2:]).softmax(-1).sum(dim=(0, 1, 2))
    assert torch.allclose(probe.layers[0], want, atol=1e-6)
    assert probe.layers[0][-1] == 0 and abs(float(probe.scores().sum()) - h * 2) < 1e-4


@torch.inference_mode()
def test_probe_inside_the_model_matches_eager_attention_weights():
    lm = tiny_lm("qwen3", num_hidden_layers=2)  # q/k norms and GQA inside the attention module
    eager = tiny_lm("qwen3", num_hidden_layers=2, attn="eager", banded=False)
    ids = torch.arange(3, 40)
    n = ids.numel()
    probe = AttentionProbe(rows=3)
    recompute_rows(lm, new_cache(lm, n), ids, torch.arange(n), n, probe)
    weights = eager.model(input_ids=ids[None], output_attentions=True).attentions
    assert len(probe.layers) == len(weights) == 2
    for got, w in zip(probe.layers, weights):
        assert torch.allclose(got, w[0, :, -3:].sum(dim=(0, 1)), atol=1e-4)
    deep = AttentionProbe(rows=3, from_layer=1)  # what qr ranks by: the shallow layer is not scored
    recompute_rows(lm, new_cache(lm, n), ids, torch.arange(n), n, deep)
    assert deep.calls == 2 and len(deep.layers) == 1 and torch.equal(deep.scores(), probe.layers[1])


def test_a_model_off_ragpic_attention_gets_a_clear_error():
    lm = tiny_lm("llama", attn="eager", banded=False)
    segs = linked_prompt(lm, compile_texts(lm))
    with pytest.raises(LinkError, match="qr-5.*ragpic's attention.*load_model"):
        link(lm, segs, "qr-5")


def test_chunked_link_runs_qr_whole():
    lm = tiny_lm("llama", num_hidden_layers=2)
    segs = linked_prompt(lm, compile_texts(lm))
    job = ChunkedLink(lm, segs, "qr-20", piece_rows=4)
    assert job.pieces == 1 and job.advance()
    assert torch.equal(job.result.logits, link(lm, segs, "qr-20").logits)
