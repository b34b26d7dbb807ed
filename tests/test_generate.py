"""Decoding from a linked cache: greedy equals HF generate, sampling, stop strings, streaming."""

from __future__ import annotations

import torch

from ragpic.core.decode import Sampling, decode_tokens
from ragpic.core.decode import TextDelta, held_back, stream_text
from ragpic.core.link import link
from ragpic.core.segments import Segment
from tiny import tiny_lm


def _prompt(lm):
    ids = torch.tensor(lm.tokenizer("<s>user\nthe quick brown fox jumps over</s>\n<s>assistant\n",
                                    add_special_tokens=False)["input_ids"])
    return ids, [Segment(token_ids=ids)]


def test_greedy_from_full_link_equals_hf_generate():
    lm = tiny_lm("llama", num_hidden_layers=3)
    lm.model.generation_config.eos_token_id = None  # random weights: run to the length limit
    ids, segs = _prompt(lm)
    res = link(lm, segs, "full", extra_capacity=20)
    ours = list(decode_tokens(lm, res.cache, res.logits, res.num_tokens, Sampling(max_new_tokens=20)))
    ref = lm.model.generate(ids[None], max_new_tokens=20, do_sample=False, min_new_tokens=20,
                            attention_mask=torch.ones_like(ids)[None], pad_token_id=0)[0, ids.numel():]
    assert ours == ref.tolist()


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    lm = tiny_lm("llama")
    lm.model.generation_config.eos_token_id = None
    _, segs = _prompt(lm)

    def run(**kw):
        res = link(lm, segs, "full", extra_capacity=12)
        return list(decode_tokens(lm, res.cache, res.logits, res.num_tokens, Sampling(max_new_tokens=12, **kw)))

    assert run(temperature=1.0, seed=3) == run(temperature=1.0, seed=3)
    assert run(temperature=1.0, top_k=1, seed=5) == run()
    assert run(temperature=1.0, top_p=1e-6, seed=9) == run()


def test_eos_ends_generation():
    lm = tiny_lm("llama")
    _, segs = _prompt(lm)
    res = link(lm, segs, "full", extra_capacity=5)
    first = int(res.logits.argmax())
    lm.model.generation_config.eos_token_id = first
    assert list(decode_tokens(lm, res.cache, res.logits, res.num_tokens, Sampling(max_new_tokens=5))) == []


class _FakeTok:
    """Decodes ids as characters so the stop-string logic can be checked exactly."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def _deltas(text, stop, max_new=100):
    s = Sampling(max_new_tokens=max_new, stop=tuple(stop))
    return list(stream_text(_FakeTok(), iter(ord(c) for c in text), s))


def test_stop_string_is_cut_and_never_emitted():
    out = _deltas("hello world\nQuestion: next", ["\nQuestion:"])
    assert "".join(d.text for d in out) == "hello world"
    assert out[-1].finish_reason == "stop"
    assert all("\n" not in d.text for d in out)  # the held-back prefix never leaked


def test_prefix_of_a_stop_string_is_released_when_it_does_not_complete():
    out = _deltas("a\nb", ["\nQ"])
    assert "".join(d.text for d in out) == "a\nb"
    assert out[-1].finish_reason == "eos"
    assert held_back("abc\nQu", ["\nQuestion"]) == 3


def test_streaming_yields_incrementally_and_reports_length():
    out = _deltas("abcdef", [], max_new=6)
    assert [d.text for d in out if d.text] == list("abcdef")
    assert out[-1].finish_reason == "length"
    assert isinstance(out[0], TextDelta)
