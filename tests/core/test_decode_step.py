"""The lean decode step (ragpic.core.decode_step) computes what transformers' forward computes,
for one request and for a batch, under dense and quantized weights; gemma falls back."""

from __future__ import annotations

import pytest
import torch

from ragpic.core.decode_step import decode_step_for
from ragpic.core.forward import forward_rows
from ragpic.core.ops.linked_cache import LinkedCache
from ragpic.core.weights import WeightFormat
from ragpic.core.weights.apply import quantize_model
from tiny import tiny_lm


def _filled(lm, rows: int, capacity: int, seed: int) -> LinkedCache:
    torch.manual_seed(seed)
    cache = LinkedCache(lm.num_layers, lm.num_kv_heads, lm.head_dim, capacity, dtype=lm.dtype, device=lm.device)
    ids = torch.randint(3, 300, (rows,))
    with torch.inference_mode():
        forward_rows(lm, cache, ids, torch.arange(rows), rows)
    return cache


@pytest.mark.parametrize("kind,overrides", [("llama", {}), ("qwen2", {}), ("qwen3", {"head_dim": 16}),
                                            ("mistral", {"sliding_window": 12})])
def test_the_decode_step_gives_the_forwards_logits(kind, overrides):
    lm = tiny_lm(kind, **overrides)
    step = decode_step_for(lm)
    assert step is not None and decode_step_for(lm) is step  # made once
    a, b = _filled(lm, 20, 32, 1), _filled(lm, 9, 32, 2)
    a2, b2 = _filled(lm, 20, 32, 1), _filled(lm, 9, 32, 2)
    with torch.inference_mode():
        got = step(torch.tensor([7, 11]), [20, 9], [a, b])
        want = torch.stack([forward_rows(lm, a2, torch.tensor([7]), torch.tensor([20]), 21)[-1],
                            forward_rows(lm, b2, torch.tensor([11]), torch.tensor([9]), 10)[-1]]).float()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (a.length, b.length) == (21, 10)
    torch.testing.assert_close(a.key_slab[:, :, :, :21], a2.key_slab[:, :, :, :21])


@pytest.mark.parametrize("fmt", [WeightFormat.INT8, WeightFormat.INT4])
def test_the_decode_step_under_quantized_weights(fmt):
    lm = tiny_lm("qwen2", num_key_value_heads=4)
    quantize_model(lm.model, fmt)
    cache, ref = _filled(lm, 15, 24, 3), _filled(lm, 15, 24, 3)
    with torch.inference_mode():
        got = decode_step_for(lm)(torch.tensor([5]), [15], [cache])[0]
        want = forward_rows(lm, ref, torch.tensor([5]), torch.tensor([15]), 16)[-1].float()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_gemma_decodes_through_the_generic_forward():
    assert decode_step_for(tiny_lm("gemma")) is None
