"""The CPU's key-block pass (ragpic.core.ops.key_blocks): exact against plain attention and
against one call per band, on raw tensors and tiny models of every architecture."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ragpic.core.link import link
from ragpic.core.ops import key_blocks
from ragpic.core.ops.attention import BandPlan, banded_sdpa, query_bands
from ragpic.core.forward import additive_mask
from ragpic.core.ops.key_blocks import KeyBlockPlan, plan_key_blocks
from prompts import prompt_with
from test_attention import POSITIONS, _qkv, _reference
from tiny import tiny_lm

TOL = 1e-5
LAYOUTS = {
    "legolink-like": (POSITIONS, 200),  # keys before the first band: one more stretch
    "from-zero": ([0, 1, 2, *range(50, 53), 77, *range(120, 128)], 128),  # a lone row at 77
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("call_cost", [0, 60])  # a band per run of rows; some runs merged
def test_key_block_sdpa_equals_plain_attention(layout, call_cost):
    pos, n = LAYOUTS[layout]
    q, k, v = _qkv(len(pos), n, seed=3)
    mask = additive_mask(torch.tensor(pos), n, dtype=torch.float32)
    bands = query_bands(pos, call_cost=call_cost)
    assert len(bands) > 1
    plan = plan_key_blocks(bands, pos, mask, groups=3)
    # every (row, key) a row can see is covered exactly once by the plan's calls
    seen = torch.zeros(len(pos), n, dtype=torch.int64)
    for r0, k0, k1 in plan.whole:
        seen[r0:, k0:k1] += 1
    for r0, r1, k0, k1, m in plan.own:
        rows = m[0, 0, : r1 - r0] if m is not None else torch.zeros(r1 - r0, k1 - k0)
        seen[r0:r1, k0:k1] += (rows == 0).long()
    assert torch.equal(seen, (mask[0, 0] == 0).long())
    out, _ = banded_sdpa(None, q, k, v, mask, scaling=0.25, ragpic_bands=plan)
    ref = _reference(q, k, v, mask, 0.25).transpose(1, 2)
    assert out.shape == (1, len(pos), 6, 16)
    assert (out - ref).abs().max() <= TOL


def test_the_cpu_picks_key_blocks_for_several_bands_and_bands_otherwise():
    lm = dataclasses.replace(tiny_lm("llama"), call_cost=0)  # a band per run of rows
    pos = torch.tensor(POSITIONS)
    mask = additive_mask(pos, 200, dtype=torch.float32)
    assert isinstance(lm.band_plan(pos, mask), KeyBlockPlan)
    assert isinstance(dataclasses.replace(lm, key_blocks=False).band_plan(pos, mask), BandPlan)
    one_band = torch.arange(190, 200)
    one_call = dataclasses.replace(lm, call_cost=None)  # the CPU's price: one band for a run of rows
    assert isinstance(one_call.band_plan(one_band, mask[:, :, :10]), BandPlan)
    windowed = dataclasses.replace(tiny_lm("mistral", sliding_window=24), call_cost=0)
    assert isinstance(windowed.band_plan(pos, mask), BandPlan)  # a window cuts the stretches
    bf16 = additive_mask(pos, 200, dtype=torch.bfloat16)
    assert isinstance(lm.band_plan(pos, bf16), BandPlan)  # the merge is done in fp32 only


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "gemma"])
def test_link_with_key_blocks_equals_link_with_one_call_per_band(kind, monkeypatch):
    lm = dataclasses.replace(tiny_lm(kind, num_hidden_layers=3), call_cost=0)  # tiny prompts: force bands
    per_band = dataclasses.replace(lm, key_blocks=False)
    calls = []
    flash = key_blocks._flash()
    monkeypatch.setattr(key_blocks, "_flash", lambda: lambda *a, **kw: calls.append(1) or flash(*a, **kw))
    segs = prompt_with(lm)
    full = link(lm, segs, "full")
    for method in ("legolink-2", "qr-30", "cacheblend-30", "legolink-1000"):
        calls.clear()
        a, b = link(lm, segs, method), link(per_band, segs, method)
        assert calls, f"{method} did not run the key-block pass"
        assert (a.logits - b.logits).abs().max() <= 1e-4
        for x, y in zip(a.cache.key_slab, b.cache.key_slab):
            assert (x[:, :, :a.num_tokens] - y[:, :, :b.num_tokens]).abs().max() <= 1e-4
    assert (a.logits - full.logits).abs().max() <= 1e-4  # legolink-1000 recomputes every token


def test_a_plan_for_other_rows_is_refused():
    pos, n = LAYOUTS["from-zero"]
    q, k, v = _qkv(len(pos) - 1, n)
    mask = additive_mask(torch.tensor(pos), n, dtype=torch.float32)
    plan = plan_key_blocks(query_bands(pos, call_cost=0), pos, mask, groups=3)
    with pytest.raises(ValueError, match="query rows"):
        key_blocks.key_block_sdpa(q, k, v, plan, 0.25)
