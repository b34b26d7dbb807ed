"""Chunks compiled behind their context (docs/ARCHITECTURE.md §1.3) on tiny random models: behind
exactly the text before them in a prompt, the cheapest link reproduces ``full``."""

from __future__ import annotations

import pytest
import torch

from ragpic.core.compile import ChunkInParts, compile_chunks, compile_in_context, document_contexts
from ragpic.core.link import link
from ragpic.core.compile_recipe import PLAIN, context_recipe, links_as, recipe_dummies
from ragpic.core.methods import parse_variant
from ragpic.errors import ChunkError, ConfigError, LinkError
from prompts import CHUNKS, compile_in_place, compile_texts, linked_prompt
from tiny import tiny_lm

TOL = 1e-4
ARCHS = [("llama", "sdpa"), ("llama", "eager"), ("qwen2", "sdpa"), ("mistral", "sdpa"),
         ("qwen3", "sdpa"), ("gemma", "sdpa")]


@pytest.mark.parametrize("kind,attn", ARCHS)
def test_chunks_compiled_behind_their_true_context_link_to_full(kind, attn):
    lm = tiny_lm(kind, attn=attn, num_hidden_layers=3)
    segs = linked_prompt(lm, compile_in_place(lm))
    full = link(lm, segs, "full")
    for method in ("naive", "legolink-1"):  # nothing is left to repair: any rows recomputed give the same
        linked = link(lm, segs, method)
        assert (full.logits - linked.logits).abs().max() <= TOL, method
        n = full.num_tokens
        for a, b in ((full.cache.key_slab, linked.cache.key_slab), (full.cache.value_slab, linked.cache.value_slab)):
            assert (a[..., :n, :] - b[..., :n, :]).abs().max() <= TOL
    # the chunks alone are an approximation on the same tokens: the context is what made it exact
    alone = linked_prompt(lm, compile_texts(lm))
    assert (full.logits - link(lm, alone, "naive").logits).abs().max() > 100 * TOL


def test_a_context_is_named_by_its_recipe_and_base_position():
    lm = tiny_lm("qwen2", num_hidden_layers=2)
    ids = [lm.tokenizer(t, add_special_tokens=False)["input_ids"] for t in CHUNKS]
    contexts = document_contexts(ids, 1, glue=[7])
    assert contexts == [[], ids[0] + [7], ids[1] + [7]]
    kvs = compile_in_context(lm, ids, contexts)
    assert [kv.recipe for kv in kvs] == [PLAIN, context_recipe(contexts[1]), context_recipe(contexts[2])]
    assert [kv.base_position for kv in kvs] == [0, len(contexts[1]), len(contexts[2])]
    assert [recipe_dummies(kv.recipe) for kv in kvs] == [kv.base_position for kv in kvs]
    plain = compile_chunks(lm, ids[:1])[0]  # no context: the plain compile (to rounding: it was batched wider)
    torch.testing.assert_close(kvs[0].keys, plain.keys, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kvs[0].values, plain.values, atol=1e-5, rtol=1e-5)
    # the same chunk behind another context is another entry with other KV
    other = compile_in_context(lm, ids[2:], [ids[0] + [7]])[0]
    assert other.recipe != kvs[2].recipe and not torch.allclose(other.keys, kvs[2].keys)
    # behind every chunk before it, with nothing between
    assert document_contexts(ids, 5) == [[], ids[0], ids[0] + ids[1]]


def test_context_recipes_parse_and_link_as_plain():
    r = context_recipe([1, 2, 3])
    assert r == context_recipe([1, 2, 3]) != context_recipe([1, 2, 4]) and r.startswith("ctx3-")
    assert recipe_dummies(r) == 3 and links_as(r) == PLAIN and links_as("bos4") == "bos4"
    assert context_recipe([]) == PLAIN
    for bad in ("ctx0-0123456789abcdef", "ctx3-xyz", "ctx3", "ctx-3-0123456789abcdef"):
        with pytest.raises(ConfigError, match="unknown compile recipe"):
            recipe_dummies(bad)


def test_bad_contexts_are_refused_naming_the_chunk():
    lm = tiny_lm("llama", num_hidden_layers=2, max_position_embeddings=64)
    with pytest.raises(ChunkError, match="contexts has 1 entries for 2 chunks"):
        compile_in_context(lm, [[5, 6], [7, 8]], [[1]])
    with pytest.raises(ChunkError, match="chunk 1 has 2 tokens \\(\\+63 rows") as err:
        compile_in_context(lm, [[5, 6], [7, 8]], [[], [1] * 63])
    assert err.value.index == 1
    with pytest.raises(ChunkError, match="behind=-1"):
        document_contexts([[1]], -1)
    with pytest.raises(ChunkError, match="compile_in_context"):
        compile_chunks(lm, [[5, 6]], recipe=context_recipe([1]))
    with pytest.raises(ChunkError, match="names a context"):
        ChunkInParts(lm, [5, 6], context_recipe([1]))


def test_a_method_on_dummy_tokens_refuses_a_chunk_compiled_behind_context():
    lm = tiny_lm("llama", num_hidden_layers=2)
    segs = linked_prompt(lm, compile_in_place(lm))
    with pytest.raises(LinkError, match="legolink-0 needs 'bos4'"):
        link(lm, segs, "legolink-0")


def test_evaluation_variants_parse_into_fields():
    def fields(name):
        v = parse_variant(name)
        return v.method.name, v.behind, str(v.quant), v.head

    assert fields("qr-4-k4-h2-w-s@prev4@int8") == ("qr-4-k4-h2-w-s", 4, "int8", "")
    assert fields("legolink-16") == ("legolink-16", 0, "none", "")
    assert fields("naive@head@prev2") == ("naive", 2, "none", "head")
    assert fields("naive@head3@int8") == ("naive", 0, "int8", "head3")
    assert fields("balanced@chat@prev4") == ("balanced", 4, "none", "chat")
    v = parse_variant("qr-4-k4-h2-w-s@prev4@int8")
    assert (v.method.kind, v.method.k, v.method.ratio, v.method.hops, v.method.words, v.method.sentences) == \
        ("qr", 4, 0.04, 2, True, True)
    assert v.name == "qr-4-k4-h2-w-s@prev4@int8" and v.key == "plain@prev4@int8"
    for bad, match in (("legolink-16@int8@prev4", "unknown variant 'prev4'"), ("naive@prev0", "unknown variant"),
                       ("naive@prev2@prev3", "at most once"), ("legolink-0@prev2", "drop '@prev2'"),
                       ("naive@prev2@head", "in that order"), ("legolink-0@head", "drop '@head'"),
                       ("naive@head0", "unknown variant 'head0'"),
                       ("naive@head@chat", "at most once"), ("legolink-0@chat", "drop '@chat'")):
        with pytest.raises(ConfigError, match=match):
            parse_variant(bad)
