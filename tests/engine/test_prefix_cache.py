"""The leading text linked from kept KV (:mod:`ragpic.engine.prefix`) on tiny random models:
exact against the same link that recomputes it, and never more than it was asked to hold."""

from __future__ import annotations

import pytest
import torch

from ragpic.core.decode import Sampling
from ragpic.core.link import link, linker_for
from ragpic.core.link.query_guided import chunk_spans
from ragpic.core.methods import parse_method
from ragpic.engine.offline import request
from ragpic.engine.prefix import PrefixCache
from ragpic.engine.request import LinkedRequest
from prompts import compile_texts, linked_prompt
from tiny import tiny_lm

TOL = 1e-4


def kept_from(lm, segs, method="full") -> PrefixCache:
    """A cache that saw one finished link of ``segs`` (by ``method``)."""
    cache = PrefixCache(lm.fingerprint)
    req = request(lm, segs, parse_method(method), 1, prefixes=cache).link()
    assert len(cache) == 1 and cache.tokens == segs[0].num_tokens
    req.release()
    return cache


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "gemma"])
@pytest.mark.parametrize("method", ["naive", "legolink-16", "legolink-1", "qr-30-k1", "qp-30-k1", "qr-100", "qp-100-h2"])
def test_a_kept_prefix_links_what_recomputing_it_would(kind, method):
    lm = tiny_lm(kind, num_hidden_layers=4)
    segs = linked_prompt(lm, compile_texts(lm))
    cache = kept_from(lm, segs)
    applied = cache.apply(segs, linker_for(method))
    assert applied[0].is_chunk and torch.equal(applied[0].token_ids, segs[0].token_ids) and not segs[0].is_chunk
    assert cache.hits == 1
    plain, fast = link(lm, segs, method), link(lm, applied, method)
    n, head = plain.num_tokens, segs[0].num_tokens
    assert (plain.logits - fast.logits).abs().max() <= TOL
    for a, b in ((plain.cache.key_slab, fast.cache.key_slab), (plain.cache.value_slab, fast.cache.value_slab)):
        assert (a[..., :n, :] - b[..., :n, :]).abs().max() <= TOL
    # the same rows but the head's: the runs a query-guided link may repair do not change
    assert not bool(fast.rows[:head].any()) and torch.equal(plain.rows[head:], fast.rows[head:])
    passes = 2 if method.startswith("qp") else 1  # qp's probe pass ran the head too; qr's second pass starts later
    assert fast.recomputed == plain.recomputed - passes * head
    if method.startswith(("qr-100", "qp-100")):  # a full budget with the prefix kept is still full
        assert (link(lm, segs, "full").logits - fast.logits).abs().max() <= TOL


def test_chunk_at_position_zero_has_no_runs_to_repair():
    lm = tiny_lm("llama", num_hidden_layers=2)
    kvs = compile_texts(lm)
    segs = linked_prompt(lm, kvs, head=None)  # chunk 0 starts the prompt: its compiled KV is full's
    runs = chunk_spans(segs)
    assert runs and min(a for a, _ in runs) == kvs[0].num_tokens + segs[1].num_tokens
    with_head = linked_prompt(lm, kvs)
    assert chunk_spans(with_head)[0][0] == with_head[0].num_tokens


def test_full_and_cacheblend_recompute_the_prefix_and_other_methods_need_its_ids():
    lm = tiny_lm("llama", num_hidden_layers=3)
    segs = linked_prompt(lm, compile_texts(lm))
    cache = kept_from(lm, segs, "legolink-16")  # any method's leading rows are full's
    for method in ("full", "cacheblend-15"):
        assert not cache.apply(segs, linker_for(method))[0].is_chunk
    other = linked_prompt(lm, compile_texts(lm), head="<s>system\nanother instruction</s>\n<s>user\n")
    misses = cache.misses  # the link that filled it was one
    assert not cache.apply(other, linker_for("legolink-16"))[0].is_chunk and cache.misses == misses + 1
    # legolink-0 links chunks compiled behind dummy tokens; the head is full's rows whatever the recipe
    segs0 = linked_prompt(lm, compile_texts(lm, recipe=parse_method("legolink-0").recipe))
    applied = cache.apply(segs0, linker_for("legolink-0"))
    assert applied[0].kv.recipe == "bos4"
    assert (link(lm, segs0, "legolink-0").logits - link(lm, applied, "legolink-0").logits).abs().max() <= TOL


def test_the_cache_holds_at_most_its_tokens_least_recently_used_out():
    lm = tiny_lm("llama", num_hidden_layers=2)
    kvs = compile_texts(lm)
    heads = [f"<s>system\ninstruction number {i} for the passages</s>\n<s>user\n" for i in range(3)]
    prompts = [linked_prompt(lm, kvs, head=h) for h in heads]
    size = prompts[0][0].num_tokens
    assert all(p[0].num_tokens == size for p in prompts)
    cache = PrefixCache(lm.fingerprint, max_tokens=2 * size)
    for p in prompts[:2]:
        request(lm, p, parse_method("legolink-16"), 1, prefixes=cache).link()
    assert len(cache) == 2 and cache.tokens == 2 * size
    cache.apply(prompts[0], linker_for("legolink-16"))  # prompt 0's head is now the most recent
    request(lm, prompts[2], parse_method("legolink-16"), 1, prefixes=cache).link()
    assert cache.tokens == 2 * size
    assert cache.apply(prompts[0], linker_for("legolink-16"))[0].is_chunk
    assert not cache.apply(prompts[1], linker_for("legolink-16"))[0].is_chunk  # the least recent went
    assert cache.apply(prompts[2], linker_for("legolink-16"))[0].is_chunk
    off = PrefixCache(lm.fingerprint, max_tokens=0)
    request(lm, prompts[0], parse_method("legolink-16"), 1, prefixes=off).link()
    assert len(off) == 0
    with pytest.raises(ValueError, match="max_tokens"):
        PrefixCache(lm.fingerprint, max_tokens=-1)


def test_a_prompt_that_is_all_text_or_starts_with_a_chunk_keeps_nothing():
    lm = tiny_lm("llama", num_hidden_layers=2)
    kvs = compile_texts(lm)
    cache = PrefixCache(lm.fingerprint)
    request(lm, linked_prompt(lm, kvs, head=None), parse_method("legolink-16"), 1, prefixes=cache).link()
    only_text = linked_prompt(lm, kvs)[:1]
    request(lm, only_text, parse_method("legolink-16"), 1, prefixes=cache).link()
    assert len(cache) == 0


def test_a_salt_links_only_the_leading_text_its_own_requests_kept():
    """A server salts with the namespace: one tenant's system prompt is never linked from (nor
    counted as cached for) another's, while each still links its own."""
    lm = tiny_lm("llama", num_hidden_layers=2)
    segs = linked_prompt(lm, compile_texts(lm))
    cache = PrefixCache(lm.fingerprint)
    legolink = parse_method("legolink-16")

    def salted(salt: str) -> LinkedRequest:
        return LinkedRequest(lm, segs, legolink, Sampling(max_new_tokens=1), prefixes=cache, cache_salt=salt)

    alice = salted("alice").link()
    assert len(cache) == 1
    bob = salted("bob")
    assert not bob.segments[0].is_chunk and cache.misses == 2 and cache.hits == 0
    assert not cache.apply(segs, linker_for(legolink))[0].is_chunk  # nor the unsalted default
    bob.link()
    assert len(cache) == 2  # bob kept his own copy of the same ids
    again = salted("alice")
    assert again.segments[0].is_chunk and cache.hits == 1
    logits = again.link().first_logits, alice.first_logits, bob.first_logits
    assert (logits[0] - logits[1]).abs().max() <= TOL and (logits[1] - logits[2]).abs().max() <= TOL
    with pytest.raises(TypeError, match="salt"):
        cache.apply(segs, linker_for(legolink), salt=None)
