"""Bad input at every entry point gets a ConfigError that names the argument and what to pass,
and the silent traps (a str where a list goes, short chunks, split stop strings) are closed."""

from __future__ import annotations

import math

import pytest

from ragpic import Config, RagPic
from ragpic.core.decode import Sampling
from ragpic.core.methods import parse_method
from ragpic.engine.detok import Detokenizer
from ragpic.errors import ConfigError, RagPicError
from tiny import tiny_lm

PASSAGES = [
    "the quick brown fox jumps over the lazy dog near the park.",
    "a needle hides in the haystack near dolores park.",
    "answer: eat a sandwich and sit in the sun.",
]


@pytest.fixture(scope="module")
def engine():
    lm = tiny_lm("llama", num_hidden_layers=2)
    lm.model.generation_config.eos_token_id = None
    return RagPic(Config(store=None, max_new_tokens=3), lm=lm)


@pytest.mark.parametrize("kwargs,message", [
    ({"temperature": -1}, "temperature must be a number >= 0"),
    ({"temperature": math.nan}, "temperature must be a number >= 0"),
    ({"top_p": 5}, r"top_p must be a number in \(0, 1\]"),
    ({"max_new_tokens": 2.5}, "max_new_tokens must be an integer >= 1, got 2.5"),
    ({"max_new_tokens": True}, "max_new_tokens must be an integer"),
    ({"store_size_limit_gb": math.nan}, "store_size_limit_gb must be a number of GiB > 0"),
    ({"min_chunk_tokens": 0}, "min_chunk_tokens must be an integer >= 1"),
    ({"method": "legolink-²"}, "unknown link method 'legolink-²'"),
    ({"kv_quant": "fp4"}, "kv_quant must be one of"),
])
def test_config_refuses_bad_values_naming_them(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Config(**kwargs)


def test_every_error_is_a_ragpic_error_and_the_builtin_callers_expect():
    with pytest.raises(RagPicError):
        parse_method("quick")
    with pytest.raises(ValueError):
        parse_method("cacheblend-0")


@pytest.mark.parametrize("prompt,message", [
    (None, "prompt must be a str or a non-empty list"),
    (42, "prompt must be a str or a non-empty list"),
    ([], "prompt must be a str or a non-empty list"),
    ([{"content": "hi"}], r"prompt\[0\] must be a \{'role': str, 'content': str\} dict"),
    ("broken \ud800 text", r"prompt contains '\\ud800' at index 7, a lone surrogate"),
    ([{"role": "user", "content": "x\udfff"}], r"prompt\[0\]\['content'\] contains"),
])
def test_generate_refuses_bad_prompts(engine, prompt, message):
    with pytest.raises(ConfigError, match=message):
        engine.generate(prompt)


@pytest.mark.parametrize("kwargs,message", [
    ({"max_new_tokens": 2.5}, "max_new_tokens must be an integer >= 1, got 2.5"),
    ({"temperature": math.nan}, "temperature must be a number >= 0"),
    ({"top_k": -1}, "top_k must be an integer >= 0"),
    ({"stop": [""]}, "stop strings must be non-empty"),
    ({"stop": [3]}, r"stop\[0\] must be a str, got int"),
    ({"hints": "the quick brown fox"}, r"hints must be a list of texts, got a single str: pass \['the quick"),
    ({"hints": [None]}, r"hints\[0\] must be a str, got NoneType"),
    ({"temprature": 0.5}, r"unknown sampling argument\(s\) \['temprature'\]"),
])
def test_generate_refuses_bad_settings(engine, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        engine.generate("question: what?", **kwargs)


@pytest.mark.parametrize("texts,message", [
    ("passage one is here", r"texts must be a list of texts, got a single str: pass \['passage one"),
    ([123], r"texts\[0\] must be a str, got int 123"),
    (["fine text that is long enough here", b"bytes"], r"texts\[1\] must be a str, got bytes"),
    (["lone \udc80 surrogate"], r"texts\[0\] contains '\\udc80' at index 5"),
    (None, "texts must be a list of texts, got NoneType"),
])
def test_compile_refuses_bad_texts(engine, texts, message):
    with pytest.raises(ConfigError, match=message):
        engine.compile(texts)


def test_a_single_stop_string_is_one_stop_string():
    assert Sampling(stop="ht").stop == ("ht",)

    class Chars:  # decodes ids as characters, so the stop logic is checked exactly
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(i) for i in ids)

    detok, out = Detokenizer(Chars(), Sampling(stop="ht").stop), ""
    for c in "this that; ht end":
        piece, stopped = detok.push(ord(c))
        out += piece
        if stopped:
            break
    assert out == "this that; "  # not cut at the first 'h' or 't'


def test_short_texts_are_never_cached_or_matched(engine):
    before = engine.store.texts()  # the module's engine may hold chunks of earlier tests
    assert engine.compile(["an", "the fox"]) == 0  # shorter than min_chunk_tokens (16)
    assert engine.store.texts() == before  # nothing stored
    g = engine.generate("a banana and the fox", hints=["an", "the fox"])
    assert (g.chunks_matched, g.chunks_loaded, g.chunks_compiled) == (0, 0, 0)
    assert engine.store.texts() == before  # nor compiled on a miss


def test_chunks_match_on_word_boundaries_only(engine):
    inner = "ick brown fox jumps over the lazy dog near the park."  # PASSAGES[0] minus "the qu"
    assert engine.cacheable(inner)
    engine.compile([inner])
    g = engine.generate(f"passages:\n{PASSAGES[0]}\nquestion: what?", hints=[inner])
    assert g.chunks_matched == 0  # it sits inside the word "quick"
    g = engine.generate(f"passages:\n{inner}\nquestion: what?", hints=[inner])
    assert (g.chunks_matched, g.chunks_loaded) == (1, 1)


def test_short_chunks_still_match_in_a_large_catalog():
    lm = tiny_lm("llama", num_hidden_layers=1)
    engine = RagPic(Config(store=None, max_new_tokens=2, min_chunk_tokens=4), lm=lm)
    short = "eat a sandwich now."  # under the 32-character scan anchor
    filler = [f"the lazy dog number {i} jumps over the quick brown fox." for i in range(70)]
    assert engine.compile([short, *filler]) == 71
    g = engine.generate(f"passages:\n{filler[3]}\n\n{short}\nquestion: what?")  # no hints: catalog scan
    assert (g.chunks_matched, g.chunks_loaded) == (2, 2)
