"""Decoding from a linked cache: greedy equals HF generate, sampling, stop strings, streaming."""

from __future__ import annotations

import pytest
import torch

from ragpic.core.decode import Sampling, decode_tokens
from ragpic.engine.detok import Detokenizer, held_back, stop_hit
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


# ----- the incremental window: the whole answer's text, at a cost per token independent of its length

ANSWER = ("The fox jumps 🦊🐕 over the dog; 快速的棕色狐狸跳过了懒狗。 Ünïcödé ½ → ∞, "
          "emoji 👩‍👩‍👧 and 🇫🇷 flags, さようなら. ")


def _tokenizer(name):
    from tiny import tiny_tokenizer

    if name == "tiny":
        return tiny_tokenizer()
    from transformers import AutoTokenizer

    from ragpic.core.default_model import default_model_dir

    try:
        return AutoTokenizer.from_pretrained(str(default_model_dir()))
    except (FileNotFoundError, OSError) as e:
        pytest.skip(f"the embedded SmolLM2 is not installed: {e}")


def _answer_ids(tok, n=4096, eos=True):
    """``n`` ids of ANSWER repeated (with an EOS, a special token: skipped, after every 8th) and
    the ids of one ANSWER."""
    block = tok(ANSWER, add_special_tokens=False)["input_ids"]
    ids, k = [], 0
    while len(ids) < n:
        k += 1
        ids += block + ([tok.eos_token_id] if eos and k % 8 == 0 else [])
    return ids[:n], len(block)


def _stream(tok, ids, stops=()):
    """All the deltas of pushing ``ids`` (and the flush, when no stop string hit): (text, stopped)."""
    d, out = Detokenizer(tok, stops), []
    for t in ids:
        piece, stopped = d.push(t)
        out.append(piece)
        if stopped:
            return "".join(out), True
    assert d.ids == list(ids)
    return "".join(out) + d.flush(), False


@pytest.mark.parametrize("name", ["tiny", "smollm2"])
def test_a_long_answer_streams_to_exactly_its_decoded_text(name):
    tok = _tokenizer(name)
    ids, _ = _answer_ids(tok)
    full = tok.decode(ids, skip_special_tokens=True)
    assert "🦊" in full and "狐狸" in full and "\ufffd" not in full[:-1]  # the 4,096th id may end inside one
    assert _stream(tok, ids) == (full, False)
    # prefixes of the stop strings recur all along the answer and are released each time
    assert _stream(tok, ids, ("狐狸跳!", "🐕 overt", "👩‍👩‍👧!")) == (full, False)
    # and one hits near the end, spanning ids: nothing of it comes out
    marked = ids[:3900] + tok("\n\nQuestion: 狐狸?", add_special_tokens=False)["input_ids"] + ids[3900:]
    marked_text = tok.decode(marked, skip_special_tokens=True)
    cut = marked_text.index("\n\nQuestion:")
    assert cut > len(full) - 300
    assert _stream(tok, marked, ("狐狸跳!", "\n\nQuestion:")) == (marked_text[:cut], True)


@pytest.mark.parametrize("name", ["tiny", "smollm2"])
def test_random_ids_decode_alike_incomplete_characters_and_all(name):
    """Ids drawn at random make broken UTF-8 (byte tokens out of order): still the same text."""
    tok = _tokenizer(name)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, len(tok), (4096,), generator=g).tolist()
    full = tok.decode(ids, skip_special_tokens=True)
    assert _stream(tok, ids) == (full, False)
    for stops in [("the", "\ufffd\ufffd\ufffd"), ("狐狸跳!",)]:
        cut = stop_hit(full, stops)
        assert _stream(tok, ids, stops) == ((full[:cut], True) if cut >= 0 else (full, False))


class _Counting:
    """A tokenizer that records how many ids each ``decode`` call receives."""

    def __init__(self, tok):
        self.tok, self.sizes = tok, []

    def decode(self, ids, skip_special_tokens=True):
        self.sizes.append(len(ids))
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.mark.parametrize("name", ["tiny", "smollm2"])
def test_the_cost_per_token_does_not_grow_with_the_answer(name):
    tok = _Counting(_tokenizer(name))
    ids, period = _answer_ids(tok.tok, eos=False)  # a periodic stream of ids
    d, largest = Detokenizer(tok, ("\n\nQuestion:",)), []  # the largest decode of each push
    for t in ids:
        before = len(tok.sizes)
        d.push(t)
        largest.append(max(tok.sizes[before:]))
    # The 10th token and the one near the 4,000th at the same place in the repeated text
    at_4000 = 9 + (4000 - 10) // period * period
    assert 3990 - period < at_4000 <= 3999
    assert largest[at_4000] <= largest[9]
    assert max(largest) <= max(largest[:2 * period]) <= 16  # a bounded window, all along
    assert sum(tok.sizes) < 10 * len(ids)  # decoding everything at each token: ~ len(ids)**2 / 2
