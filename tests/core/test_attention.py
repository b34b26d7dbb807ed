"""Banded link attention and the slab pool: exact against plain attention, raw tensors and tiny models."""

from __future__ import annotations

import dataclasses
import gc
import types

import pytest
import torch

from ragpic.core.ops import attention
from ragpic.core.ops import attention as sdpa_mod
from ragpic.core.ops.attention import banded_sdpa, grouped_sdpa, query_bands
from ragpic.core.forward import additive_mask
from ragpic.core.link import link, recompute_mask
from ragpic.core.ops.linked_cache import SlabPool
from prompts import prompt_with
from recipes import parse_method
from tiny import tiny_lm

TOL = 1e-5
# a legolink-like row layout: the first 3 tokens of chunks at 40, 90, 150, then a 6-token query
POSITIONS = [*range(40, 43), *range(90, 93), *range(150, 153), *range(194, 200)]
N = 200


def _reference(q, k, v, mask, scale):
    """Textbook attention in float64: K/V repeated per head, softmax(q k^T * scale + mask) v."""
    g = q.shape[1] // k.shape[1]
    k, v = (x.double().repeat_interleave(g, dim=1) for x in (k, v))
    scores = q.double() @ k.transpose(-1, -2) * scale + mask.double()
    return (scores.softmax(-1) @ v).float()


def _qkv(rows, n, heads=6, kv_heads=2, dim=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(1, heads, rows, dim, generator=gen), torch.randn(1, kv_heads, n, dim, generator=gen),
            torch.randn(1, kv_heads, n, dim, generator=gen))


@pytest.mark.parametrize("window", [None, 7, 64])
@pytest.mark.parametrize("call_cost", [0, None, 10**9])
def test_bands_partition_rows_and_cover_every_visible_key(window, call_cost):
    bands = query_bands(POSITIONS, sliding_window=window, call_cost=call_cost)
    assert [b.row_start for b in bands] == [0] + [b.row_end for b in bands[:-1]]
    assert bands[-1].row_end == len(POSITIONS)
    for b in bands:
        for p in POSITIONS[b.row_start:b.row_end]:
            lo = max(0, p - window + 1) if window else 0
            assert b.key_start <= lo and p < b.key_end
    if call_cost == 10**9:
        assert len(bands) == 1


def test_bands_follow_chunk_starts_of_a_long_prompt_and_merge_lone_rows():
    starts = [512 * j for j in range(1, 8)]
    pos = [p for s in starts for p in range(s, s + 16)] + list(range(4064, 4096))
    bands = query_bands(pos)
    assert [(b.row_end - b.row_start, b.key_end) for b in bands] == [(16, s + 16) for s in starts] + [(32, 4096)]
    # one token per chunk (legolink-1): seven calls would cost more than the keys they skip
    assert len(query_bands(starts + list(range(4064, 4096)))) == 1


@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("call_cost", [0, None])
def test_banded_sdpa_equals_plain_attention(window, call_cost):
    q, k, v = _qkv(len(POSITIONS), N)
    mask = additive_mask(torch.tensor(POSITIONS), N, dtype=torch.float32, sliding_window=window)
    bands = query_bands(POSITIONS, sliding_window=window, call_cost=call_cost)
    module = types.SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    out, _ = banded_sdpa(module, q, k, v, mask, scaling=0.25, ragpic_bands=bands)
    ref = _reference(q, k, v, mask, 0.25).transpose(1, 2)
    assert out.shape == (1, len(POSITIONS), 6, 16)
    assert (out - ref).abs().max() <= TOL
    plain, _ = banded_sdpa(module, q, k, v, mask, scaling=0.25)  # no bands: transformers' own SDPA
    assert (plain - ref).abs().max() <= TOL


def test_grouped_sdpa_folded_heads_equal_enable_gqa():
    q, k, v = _qkv(len(POSITIONS), N, seed=1)
    mask = additive_mask(torch.tensor(POSITIONS), N, dtype=torch.float32)
    ref = _reference(q, k, v, mask, 0.25)
    for fold in (False, True):
        assert (grouped_sdpa(q, k, v, mask, scaling=0.25, fold=fold) - ref).abs().max() <= TOL


def test_link_runs_banded_attention_and_stays_exact(monkeypatch):
    # one SDPA call per band: the CPU's key-block pass is off here (tests/core/test_key_blocks.py)
    lm = dataclasses.replace(tiny_lm("llama", num_hidden_layers=3), key_blocks=False)
    assert lm.banded_attention and lm.model.config._attn_implementation == attention.ATTENTION_NAME
    calls = []

    def counting_sdpa(*args, **kwargs):
        calls.append(args[1].shape[2])  # keys seen by this call
        return torch.nn.functional.scaled_dot_product_attention(*args, **kwargs)

    monkeypatch.setattr(attention, "CALL_COST", 0)  # one band per run of positions
    monkeypatch.setattr(sdpa_mod, "F", types.SimpleNamespace(scaled_dot_product_attention=counting_sdpa))
    segs = prompt_with(lm)
    n = sum(s.num_tokens for s in segs)
    full = link(lm, segs, "full")  # no bands: transformers' causal SDPA
    assert calls == []
    for method in ("legolink-1000", "legolink-2"):
        calls.clear()
        res = link(lm, segs, method)
        pos = recompute_mask(segs, parse_method(method)).nonzero().squeeze(1)
        bands = lm.bands(pos)
        assert len(bands) > 1 and len(calls) == 3 * len(bands)
        assert min(calls) < n  # early bands skip the keys they cannot see
        if method == "legolink-1000":
            assert (res.logits - full.logits).abs().max() <= 1e-4
    assert (res.logits - full.logits).abs().max() > 1e-2  # legolink-2 is an approximation


def test_eager_models_keep_their_attention():
    lm = tiny_lm("llama", attn="eager", num_hidden_layers=2)
    assert not lm.banded_attention and lm.bands(torch.arange(3)) is None
    assert lm.model.config._attn_implementation == "eager"


# ----------------------------------------------------------------------------- slab pool
def _pool_cache(pool, capacity, dtype=torch.float32):
    return pool.cache(2, 2, 16, capacity, dtype=dtype, device=torch.device("cpu"))


def test_pool_reuses_memory_and_a_released_cache_fails_loudly():
    pool = SlabPool()
    first = _pool_cache(pool, 100)
    ptr = first.key_slab.data_ptr()
    pool.release(first)
    with pytest.raises((TypeError, AttributeError)):
        first.layers[0].update(torch.zeros(1, 2, 1, 16), torch.zeros(1, 2, 1, 16))
    smaller = _pool_cache(pool, 80)  # a smaller request fits in the idle slab
    assert smaller.key_slab.data_ptr() == ptr and smaller.key_slab.shape == (2, 1, 2, 80, 16)
    assert _pool_cache(pool, 80).key_slab.data_ptr() != ptr  # in use: not handed out twice
    pool.release(smaller)
    assert _pool_cache(pool, 80, torch.float16).key_slab.data_ptr() != ptr  # another dtype
    assert _pool_cache(pool, 101).key_slab.data_ptr() != ptr  # too small for 101 rows
    for cap in (10, 300, 20):
        pool.release(_pool_cache(pool, cap))
    assert pool.idle_bytes == 2 * 2 * 2 * 300 * 16 * 4  # max_idle=1 keeps the largest


def test_link_into_reused_memory_equals_link_into_fresh_memory():
    lm = tiny_lm("llama", num_hidden_layers=2)
    segs = prompt_with(lm)
    pool = SlabPool()
    pool.release(link(lm, segs, "full", extra_capacity=50, pool=pool).cache)  # leaves stale rows behind
    for method in ("legolink-2", "naive", "cacheblend-30", "full"):
        fresh = link(lm, segs, method, extra_capacity=4)
        reused = link(lm, segs, method, extra_capacity=4, pool=pool)
        n = fresh.num_tokens
        assert torch.equal(fresh.logits, reused.logits), method
        assert torch.equal(fresh.cache.key_slab[:, :, :, :n], reused.cache.key_slab[:, :, :, :n])
        assert torch.equal(fresh.cache.value_slab[:, :, :, :n], reused.cache.value_slab[:, :, :, :n])
        pool.release(reused.cache)


def test_engine_hands_the_cache_back_when_a_stream_ends_or_is_abandoned(tmp_path, monkeypatch):
    from ragpic import Config, RagPic

    handed, returned = [], []  # (cache, its memory) the pool gave out; caches it got back
    give, take = SlabPool.cache, SlabPool.release

    def cache(self, *args, **kwargs):
        c = give(self, *args, **kwargs)
        handed.append((c, c.key_slab.data_ptr()))
        return c

    def release(self, c):
        returned.append(c)
        take(self, c)

    monkeypatch.setattr(SlabPool, "cache", cache)
    monkeypatch.setattr(SlabPool, "release", release)
    lm = tiny_lm("llama", num_hidden_layers=2)
    lm.model.generation_config.eos_token_id = None
    engine = RagPic(Config(store=str(tmp_path / "kv"), max_new_tokens=6), lm=lm)
    first = engine.generate("passages: the fox. question: what?")
    assert len(handed) == len(returned) == 1 and returned[0] is handed[0][0]  # back when it ended
    again = engine.generate("passages: the fox. question: what?")
    assert again.token_ids == first.token_ids
    assert len(handed) == len(returned) == 2 and returned[1] is handed[1][0]
    assert handed[1][1] == handed[0][1]  # and the next link wrote into the same memory
    stream = iter(engine.stream("passages: the dog. question: who?"))
    next(stream)
    assert len(handed) == 3 and len(returned) == 2  # still being read: not handed back yet
    del stream
    gc.collect()
    assert len(returned) == 3 and returned[2] is handed[2][0]  # abandoned: handed back
