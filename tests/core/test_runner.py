"""The model runner (ragpic.core.runner): its lean decode step computes what transformers' forward
computes, for one request and for a batch, under dense and quantized weights (gemma decodes
through the forward); its head is the model's own; a compile's prefill runs no head."""

from __future__ import annotations

import pytest
import torch

from ragpic.core.forward import cache_kwarg
from ragpic.core.runner import forward_rows, runner_for
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
    runner = runner_for(lm)
    assert runner.lean and runner_for(lm) is runner  # made once
    a, b = _filled(lm, 20, 32, 1), _filled(lm, 9, 32, 2)
    a2, b2 = _filled(lm, 20, 32, 1), _filled(lm, 9, 32, 2)
    with torch.inference_mode():
        got = runner.decode(torch.tensor([7, 11]), [20, 9], [a, b])
        want = torch.stack([forward_rows(lm, a2, torch.tensor([7]), torch.tensor([20]), 21)[-1],
                            forward_rows(lm, b2, torch.tensor([11]), torch.tensor([9]), 10)[-1]]).float()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (a.length, b.length) == (21, 10)
    torch.testing.assert_close(a.key_slab[:, :, :, :21], a2.key_slab[:, :, :, :21])


@pytest.mark.parametrize("fmt", [WeightFormat.INT8, WeightFormat.INT4])
def test_the_decode_step_under_quantized_weights(fmt):
    lm = tiny_lm("qwen2", num_key_value_heads=4)
    runner_for(lm)  # made before the weights change: it must read the new layers and head
    quantize_model(lm.model, fmt)
    cache, ref = _filled(lm, 15, 24, 3), _filled(lm, 15, 24, 3)
    with torch.inference_mode():
        got = runner_for(lm).decode(torch.tensor([5]), [15], [cache])[0]
        want = forward_rows(lm, ref, torch.tensor([5]), torch.tensor([15]), 16)[-1].float()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_gemma_decodes_through_the_generic_forward():
    lm = tiny_lm("gemma")
    assert not runner_for(lm).lean
    cache, ref = _filled(lm, 12, 16, 4), _filled(lm, 12, 16, 4)
    with torch.inference_mode():
        got = runner_for(lm).decode(torch.tensor([9]), [12], [cache])[0]
        want = forward_rows(lm, ref, torch.tensor([9]), torch.tensor([12]), 13)[-1]
    assert torch.equal(got, want)


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_the_runners_head_is_the_models_own(kind):
    """Link and decode logits come from the runner's one head; it computes transformers' forward's logits."""
    lm = tiny_lm(kind)
    ids = torch.randint(3, 300, (10,), generator=torch.Generator().manual_seed(5))
    cache = LinkedCache(lm.num_layers, lm.num_kv_heads, lm.head_dim, 16, dtype=lm.dtype, device=lm.device)
    with torch.inference_mode():
        got = forward_rows(lm, cache, ids, torch.arange(10), 10, logits_to_keep=0)
        want = lm.model(input_ids=ids[None]).logits[0].float()
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_prefill_writes_the_forwards_kv_and_runs_no_head(monkeypatch):
    from transformers.cache_utils import DynamicCache

    lm = tiny_lm("qwen2")
    ids = torch.randint(3, 300, (2, 7), generator=torch.Generator().manual_seed(6))
    calls = []
    head = lm.model.get_output_embeddings()
    head.register_forward_hook(lambda *a: calls.append(1))
    cache, ref = DynamicCache(), DynamicCache()
    with torch.inference_mode():
        runner_for(lm).prefill(ids, torch.arange(7).expand(2, 7), cache)
        assert calls == []
        lm.model(input_ids=ids, use_cache=True, **{cache_kwarg(lm.model): ref})
    torch.testing.assert_close(cache.layers[0].keys, ref.layers[0].keys)
