"""Decoding from a linked cache: greedy equals HF generate, sampling, stop strings, streaming."""

from __future__ import annotations

import torch

from ragpic.core.decode import Sampling, decode_tokens
from ragpic.engine.detok import Detokenizer, held_back
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
    """Push ``text``'s characters as ids until a stop string or ``max_new``: (deltas, stopped)."""
    d = Detokenizer(_FakeTok(), tuple(stop))
    out = []
    for c in text[:max_new]:
        piece, stopped = d.push(ord(c))
        out.append(piece)
        if stopped:
            return out, True
    return out + [d.flush()], False


def test_stop_string_is_cut_and_never_emitted():
    out, stopped = _deltas("hello world\nQuestion: next", ["\nQuestion:"])
    assert "".join(out) == "hello world"
    assert stopped
    assert all("\n" not in d for d in out)  # the held-back prefix never leaked


def test_prefix_of_a_stop_string_is_released_when_it_does_not_complete():
    out, stopped = _deltas("a\nb", ["\nQ"])
    assert "".join(out) == "a\nb" and not stopped
    assert held_back("abc\nQu", ["\nQuestion"]) == 3


def test_streaming_yields_incrementally():
    out, _ = _deltas("abcdef", [], max_new=6)
    assert [d for d in out if d] == list("abcdef")
