"""The CUDA-specific paths, exercised on the CPU (docs/RESULTS.md §7): folded-heads attention and kernel
output layouts, bands from host positions, per-device band cost, the rotation's host fast
path, int8 dequantized where the KV is used, and a link + decode with no hidden host reads."""

from __future__ import annotations

import traceback
import types

import pytest
import torch

from device_checks import host_reads, reference_attention, transposed_layout_sdpa
from prompts import compile_texts, linked_prompt
from ragpic.core.decode import Sampling, decode_tokens
from ragpic.core.forward import additive_mask
from ragpic.core.kv import ChunkKV, dequantize_int8, device_kv, rotate_keys
from ragpic.core.link import link
from ragpic.core.ops import attention
from ragpic.core.ops import attention as sdpa_mod
from ragpic.core.ops.attention import (GPU_CALL_COST, banded_sdpa, call_cost_for, fold_pays, grouped_sdpa,
                                       plan_bands, query_bands)
from ragpic.core.ops.device import host_ints, to_device
from tiny import tiny_lm

# (heads, kv_heads, rows, keys, head_dim): GQA groups of 3 and 4, MQA, a single row, no GQA
SHAPES = [(6, 2, 7, 50, 16), (8, 2, 1, 33, 32), (4, 1, 12, 80, 16), (9, 3, 20, 64, 64), (4, 4, 5, 40, 16)]


def _case(heads, kv_heads, rows, keys, dim, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, rows, dim, generator=gen)
    k, v = (torch.randn(1, kv_heads, keys, dim, generator=gen) for _ in range(2))
    pos = torch.sort(torch.randperm(keys, generator=gen)[:rows]).values
    pos[-1] = keys - 1
    mask = additive_mask(pos, keys, dtype=dtype)
    return q.to(dtype), k.to(dtype), v.to(dtype), mask, pos


@pytest.fixture
def transposed_sdpa(monkeypatch):
    """SDPA returning the memory-efficient kernel's (non-contiguous) output layout."""
    monkeypatch.setattr(sdpa_mod, "F", types.SimpleNamespace(
        scaled_dot_product_attention=transposed_layout_sdpa(torch.nn.functional.scaled_dot_product_attention)))


@pytest.mark.parametrize("shape", SHAPES)
def test_folded_heads_take_a_transposed_kernel_output(shape, transposed_sdpa):
    """CUDA's memory-efficient kernel layout: ``out.view(b, h, r, -1)`` raised "view size is not
    compatible" on it."""
    q, k, v, mask, _ = _case(*shape)
    ref = reference_attention(q, k, v, mask, 0.3)
    for fold in (True, False):
        out = grouped_sdpa(q, k, v, mask, scaling=0.3, fold=fold)
        assert out.shape == ref.shape and (out.double() - ref).abs().max() <= 1e-5


@pytest.mark.parametrize("shape", SHAPES)
def test_folded_heads_equal_enable_gqa_and_float64(shape):
    q, k, v, mask, _ = _case(*shape, seed=1)
    ref = reference_attention(q, k, v, mask, 0.25)
    folded = grouped_sdpa(q, k, v, mask, scaling=0.25, fold=True)
    gqa = grouped_sdpa(q, k, v, mask, scaling=0.25, fold=False)
    assert (folded.double() - ref).abs().max() <= 1e-5 and (gqa.double() - ref).abs().max() <= 1e-5
    assert (folded - gqa).abs().max() <= 1e-5
    # an unmasked call (a band whose rows all see all keys) folds too
    assert (grouped_sdpa(q, k, v, None, scaling=0.25, fold=True).double()
            - reference_attention(q, k, v, None, 0.25)).abs().max() <= 1e-5


@pytest.mark.parametrize("fold", [True, False, None])
@pytest.mark.parametrize("call_cost", [0, 10**9])
def test_band_plan_built_once_equals_plain_attention(fold, call_cost, transposed_sdpa):
    q, k, v, mask, pos = _case(6, 2, 12, 90, 16, seed=2)
    bands = query_bands(pos.tolist(), call_cost=call_cost)
    plan = plan_bands(bands, mask, groups=3, fold=fold, kv_heads=2)
    assert all((m is None) == (not b.masked) for b, m in zip(plan.bands, plan.masks))
    assert plan.folds == (tuple([fold] * len(bands)) if fold is not None else
                          tuple(fold_pays(b.row_end - b.row_start, 3, 2, torch.get_num_threads()) for b in bands))
    rows = [b.row_end - b.row_start for b in plan.bands]
    assert all(m is None or m.shape[-2] == (3 * r if f else r) for r, m, f in zip(rows, plan.masks, plan.folds))
    module = types.SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    out, _ = banded_sdpa(module, q, k, v, mask, scaling=0.25, ragpic_bands=plan)
    ref = reference_attention(q, k, v, mask, 0.25).transpose(1, 2)
    assert (out.double() - ref).abs().max() <= 1e-5


def test_the_cpu_folds_where_the_threads_stay_busy():
    """Folding a KV head's query heads into rows pays on the CPU unless it leaves threads idle."""
    assert fold_pays(47, 7, 2, threads=2) and fold_pays(4, 7, 2, threads=2)  # Qwen2.5-0.5B on 2 cores
    assert fold_pays(200, 3, 3, threads=16)  # 3 heads x 10 blocks of 64 rows: 30 items for 16 threads
    assert not fold_pays(4, 7, 1, threads=16)  # one KV head, one block: 1 item where GQA gives 7
    assert not fold_pays(100, 1, 4, threads=2)  # no grouped heads: nothing to fold
    assert fold_pays(4, 7, 1, threads=1)


def test_a_lone_row_band_needs_no_mask():
    bands = query_bands([5, 40, 41, 90], call_cost=2)
    assert [b.masked for b in bands] == [False, True, False]
    assert not query_bands([30], sliding_window=8)[0].masked
    assert query_bands([30, 31], sliding_window=8, call_cost=10**9)[0].masked


def test_link_with_folded_heads_and_transposed_outputs_equals_link_on_the_cpu_path(monkeypatch):
    """The GPU's attention path end to end, on a model: fold forced, kernel layout transposed."""
    lm = tiny_lm("llama", num_hidden_layers=3)
    lm.model.generation_config.eos_token_id = None
    segs = linked_prompt(lm, compile_texts(lm))
    sampling = Sampling(max_new_tokens=6)

    def run(method):
        res = link(lm, segs, method, extra_capacity=6)
        return res.logits, list(decode_tokens(lm, res.cache, res.logits, res.num_tokens, sampling))

    expected = {m: run(m) for m in ("full", "legolink-2", "legolink-1000", "cacheblend-30")}
    real_plan = sdpa_mod.plan_bands
    monkeypatch.setattr(sdpa_mod, "plan_bands", lambda bands, mask, groups, fold, **kw: real_plan(
        bands, mask, groups=groups, fold=True, **kw))
    sdpa = transposed_layout_sdpa(torch.nn.functional.scaled_dot_product_attention)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)  # transformers' too
    monkeypatch.setattr(sdpa_mod, "F", types.SimpleNamespace(scaled_dot_product_attention=sdpa))
    for m, (logits, tokens) in expected.items():
        got_logits, got_tokens = run(m)
        assert (got_logits - logits).abs().max() <= 1e-4 and got_tokens == tokens, m


# ----------------------------------------------------------------------------- bands and devices
def test_bands_read_host_positions_only():
    on_device = torch.arange(4, device="meta")  # stands in for a GPU tensor: reading it would sync
    with pytest.raises(ValueError, match="sync"):
        host_ints(on_device)
    lm = tiny_lm("llama")
    with pytest.raises(ValueError, match="sync"):
        lm.bands(on_device)
    assert lm.bands(torch.tensor([3, 4, 9])) == lm.bands([3, 4, 9])


def test_band_cost_is_per_device():
    """Band cost per device: CPU bands stay fine-grained; a GPU gets one band for a 4k legolink-16 link."""
    assert call_cost_for(torch.device("cpu")) == attention.CALL_COST
    assert call_cost_for(torch.device("cuda")) == call_cost_for(torch.device("meta")) == GPU_CALL_COST
    pos = [p for s in range(512, 4096, 512) for p in range(s, s + 16)] + list(range(4064, 4096))
    assert len(query_bands(pos, call_cost=call_cost_for(torch.device("cpu")))) == 8
    assert len(query_bands(pos, call_cost=GPU_CALL_COST)) == 1
    at_32k = [p for s in range(512, 32768, 512) for p in range(s, s + 16)] + list(range(32736, 32768))
    assert 2 <= len(query_bands(at_32k, call_cost=GPU_CALL_COST)) <= 6
    lm = tiny_lm("llama")
    lm.call_cost = 10**12  # one band, whatever the device (gpu_check's "one band" bench)
    assert len(lm.bands(pos)) == 1


def test_to_device_keeps_same_device_tensors_and_converts_dtype():
    t = torch.arange(6)
    assert to_device(t, torch.device("cpu")) is t
    assert to_device(t, torch.device("cpu"), torch.float32).dtype == torch.float32


# ----------------------------------------------------------------------------- rotation
def test_int_delta_fast_path_equals_per_token_shifts():
    """Rotation's host fast path: an int delta makes no device tensor and reads nothing back; same bits as before."""
    inv_freq = 1.0 / (10000 ** (torch.arange(8, dtype=torch.float32) / 8))
    keys = torch.randn(3, 2, 9, 16)
    for delta in (1, 37, -5, 4000):
        per_token = rotate_keys(keys, torch.full((9,), delta), inv_freq)
        assert torch.equal(rotate_keys(keys, delta, inv_freq), per_token)
        out = torch.empty(3, 2, 9, 16, dtype=torch.bfloat16)
        assert torch.equal(rotate_keys(keys, delta, inv_freq, out=out), per_token.to(torch.bfloat16))
    assert rotate_keys(keys, 0, inv_freq) is keys
    with host_reads() as reads:
        rotate_keys(keys, 12, inv_freq, out=torch.empty_like(keys))
    assert not reads


# ----------------------------------------------------------------------------- int8 on the device
def _int8_copy(kv: ChunkKV) -> tuple[ChunkKV, ChunkKV]:
    """(int8 KV with scales, the same KV dequantized on the host) for one chunk."""
    from ragpic.core.kv import quantize_int8

    (qk, sk), (qv, sv) = quantize_int8(kv.keys), quantize_int8(kv.values)
    q = ChunkKV(kv.token_ids, qk, qv, kv.base_position, kv.fingerprint, kv.recipe,
                key_scales=sk, value_scales=sv, quant_dtype=kv.keys.dtype)
    f = ChunkKV(kv.token_ids, dequantize_int8(qk, sk, kv.keys.dtype), dequantize_int8(qv, sv, kv.keys.dtype),
                kv.base_position, kv.fingerprint, kv.recipe)
    return q, f


def test_int8_kv_dequantized_at_link_equals_the_store_decoding():
    """int8 KV links as is (half the bytes moved); same values as the store's decode."""
    lm = tiny_lm("llama", num_hidden_layers=3)
    kvs = compile_texts(lm)
    pairs = [_int8_copy(kv) for kv in kvs]
    q0, f0 = pairs[0]
    assert q0.is_quantized and q0.dtype == torch.float32 and q0.nbytes < f0.nbytes / 3
    assert torch.equal(dequantize_int8(q0.values, q0.value_scales, torch.float32), f0.values)
    assert torch.equal(q0.to("cpu", torch.float32).keys, f0.keys) and q0.to("cpu").is_quantized
    keys, values = device_kv(q0, lm.device)
    assert keys.dtype == torch.float32 and torch.equal(values, f0.values) and torch.equal(keys, f0.keys)
    for method in ("naive", "legolink-2", "cacheblend-30"):
        a = link(lm, linked_prompt(lm, [q for q, _ in pairs]), method)
        b = link(lm, linked_prompt(lm, [f for _, f in pairs]), method)
        assert torch.equal(a.logits, b.logits), method
    with pytest.raises(ValueError, match="int8"):
        ChunkKV(q0.token_ids, q0.keys.float(), q0.values, 0, "fp", key_scales=q0.key_scales,
                value_scales=q0.value_scales, quant_dtype=torch.float32)


# ----------------------------------------------------------------------------- host reads
EXPECTED_READS = {  # per method: the host reads of one link, each of a host tensor by construction
    "full": {"pieces.py:advance": 1},
    "naive": {"pieces.py:advance": 1, "device.py:host_ints": 1},
    "legolink-2": {"pieces.py:advance": 1, "device.py:host_ints": 1},
    "cacheblend-30": {"cacheblend.py:run_whole": 1, "device.py:host_ints": 1, "cacheblend.py:select_tokens": 1,
                      "cacheblend.py:cacheblend_rows": 1},  # the selection read back once, for its bands
}


@pytest.mark.parametrize("method", list(EXPECTED_READS))
def test_link_and_decode_read_nothing_back_but_what_they_must(method, monkeypatch):
    """A link reads back only host tensors (positions, the recompute mask) and the one
    selection CacheBlend needs; each greedy token is read once; no transformers code reads
    a tensor; no tensor is built from Python values per token."""
    lm = tiny_lm("llama", num_hidden_layers=3)
    lm.model.generation_config.eos_token_id = None
    segs = linked_prompt(lm, compile_texts(lm))
    made = []  # tensors ragpic builds from Python values (a blocking host-to-device copy on a GPU)
    for name in ("tensor", "as_tensor"):
        def build(*a, _real=getattr(torch, name), **k):
            if "/ragpic/" in traceback.extract_stack(limit=2)[0].filename:
                made.append(traceback.extract_stack(limit=2)[0])
            return _real(*a, **k)
        monkeypatch.setattr(torch, name, build)
    with host_reads() as reads:
        res = link(lm, segs, method, extra_capacity=5)
    assert dict(reads) == EXPECTED_READS[method]
    with host_reads() as reads:
        tokens = list(decode_tokens(lm, res.cache, res.logits, res.num_tokens, Sampling(max_new_tokens=5)))
    assert len(tokens) == 5 and dict(reads) == {"decode.py:next_token": 5}
    assert made == []
