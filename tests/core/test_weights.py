"""Weight formats (ragpic.core.weights): the int8/int4 layers against their dequantized weights,
a GGUF's 4-bit blocks kept exactly, and the decode step against transformers' forward under each."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ragpic.core.weights import WeightFormat, parse_weights
from ragpic.core.weights.gguf_blocks import int4_blocks
from ragpic.core.weights.linear import (DENSE_FROM, INT4_DENSE_FROM, Int4Linear, Int8Linear, pack_int4, quantize_int4, quantize_int8,
                                        unpack_int4)
from ragpic.core.weights.resolve import resolve_weights
from ragpic.errors import ConfigError
from tiny_gguf import write_tiny_gguf


def test_the_int4_pack_unpacks_to_its_codes():
    codes = torch.randint(0, 16, (128, 96), dtype=torch.uint8)
    assert torch.equal(unpack_int4(pack_int4(codes)), codes)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_quantized_layer_computes_with_its_dequantized_weight(kind):
    torch.manual_seed(0)
    w, b = torch.randn(128, 96), torch.randn(128)
    layer = (Int8Linear(*quantize_int8(w), b, torch.float32) if kind == "int8"
             else Int4Linear(*quantize_int4(w), b, torch.float32))
    dense = layer.dense_weight(torch.float32)
    assert (dense - w).abs().max() < (0.02 if kind == "int8" else 0.3) * w.abs().max()  # a quantization, not noise
    assert (layer.scales if kind == "int8" else layer.scales_zeros).dtype == torch.bfloat16  # kernel_dtype
    for rows in (1, 5):  # the weight-only kernel, its activations in bf16, its result back in fp32
        x = torch.randn(2, rows, 96)
        y = layer(x)
        assert y.dtype == torch.float32
        torch.testing.assert_close(y, x.bfloat16().float() @ dense.t() + b, rtol=0.02, atol=0.1)
    x = torch.randn(2, layer.dense_from // 2 + 3, 96)  # the dequantized GEMM, in fp32 (int4: from INT4_DENSE_FROM rows)
    torch.testing.assert_close(layer(x), x @ dense.t() + b, rtol=1e-5, atol=1e-4)
    if kind == "int4":  # below its bound int4 keeps the kernel: its dequantization costs ~4x int8's
        assert layer.dense_from == INT4_DENSE_FROM > DENSE_FROM == Int8Linear.dense_from
        x = torch.randn(2, DENSE_FROM + 3, 96)
        torch.testing.assert_close(layer(x), x.bfloat16().float() @ dense.t() + b, rtol=0.02, atol=0.1)
        assert not torch.allclose(layer(x), x @ dense.t() + b, rtol=1e-5, atol=1e-4)
    bf = (Int8Linear(*quantize_int8(w), b, torch.bfloat16) if kind == "int8"
          else Int4Linear(*quantize_int4(w), b, torch.bfloat16))
    x = torch.randn(1, 96).bfloat16()
    torch.testing.assert_close(bf(x).float(), (x.float() @ bf.dense_weight(torch.float32).t() + b), rtol=0.02, atol=0.1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_int4_dequantization_is_bit_for_bit_the_reference_formula(dtype):
    """The fast path (block layout unpacked in one casting copy, scale and zero broadcast in place)
    gives the same bits as ``(codes - 8) * scale + zero`` with both repeated to ``(N, K)``: KV
    compiled before the fast path links with it unchanged."""
    torch.manual_seed(0)
    w = torch.randn(256, 192) * 3
    codes, scales, zeros = quantize_int4(w)
    layer = Int4Linear(codes, scales, zeros, None, dtype)
    sz = layer.scales_zeros.to(dtype)
    ref = ((unpack_int4(layer.packed).to(dtype) - 8) * sz[..., 0].t().repeat_interleave(32, dim=1)
           + sz[..., 1].t().repeat_interleave(32, dim=1))
    got = layer.dense_weight(dtype)
    assert got.shape == (256, 192) and got.dtype == dtype and got.is_contiguous()
    assert torch.equal(got, ref)


@pytest.mark.parametrize("ggml", ["Q4_0", "Q4_1", "Q4_K"])
def test_gguf_4_bit_blocks_map_onto_int4_exactly(ggml):
    import gguf

    rng = np.random.default_rng(0)
    rows, cols = 64, 512
    if ggml == "Q4_K":  # gguf cannot quantize to Q4_K: random super-blocks with finite scales
        raw = rng.integers(0, 256, (rows, cols // 256, 144), dtype=np.uint8)
        raw[..., 0:4] = np.frombuffer(rng.uniform(0.001, 0.05, (rows, cols // 256, 2)).astype(np.float16).tobytes(),
                                      np.uint8).reshape(rows, cols // 256, 4)
        raw = raw.reshape(rows, -1)
    else:
        raw = gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), gguf.GGMLQuantizationType[ggml])
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[ggml]).reshape(rows, cols)
    codes, scale, zero = int4_blocks(ggml, raw, rows, cols)  # (N, K) codes; (K/32, N) scales and zeros
    mapped = (codes.float() - 8) * scale.t().repeat_interleave(32, 1) + zero.t().repeat_interleave(32, 1)
    np.testing.assert_allclose(mapped.numpy(), ref, rtol=0, atol=1e-6)
    # the layer keeps its scales in bf16, the kernels' dtype: the file's weights to bf16 rounding of a scale
    layer = Int4Linear(codes, scale, zero, None, torch.float32)
    err = np.abs(layer.dense_weight(torch.float32).numpy() - ref).max() / np.abs(ref).max()
    assert err < 8e-3, err


@pytest.mark.parametrize("quant", ["Q4_0", "Q4_1"])
def test_a_gguf_kept_in_its_own_blocks_gives_the_dequantized_models_logits(tmp_path, monkeypatch, quant):
    """weights='gguf' keeps a Q4 file's codes: in fp32 its logits are those of the same file
    dequantized by transformers, to the rounding of the layers' bf16 scales (and of the kernel's
    bf16 activations for a few rows); its fingerprint names the format."""
    from ragpic.core.model import load_model

    monkeypatch.setenv("RAGPIC_HOME", str(tmp_path / "home"))
    path = tmp_path / f"tiny-{quant}.gguf"
    write_tiny_gguf(path, "qwen2", quant=quant, num_key_value_heads=4)  # k/v rows in 64-row blocks
    dense = load_model(str(path), device="cpu", dtype="float32", weights="dense")
    kept = load_model(str(path), device="cpu", dtype="float32", weights="gguf")
    assert "int4 exact" in kept.weights_summary and "int8" not in kept.weights_summary.replace("int8 embedding", "")
    assert kept.fingerprint != dense.fingerprint and "+gguf" in kept.fingerprint
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        for n in (5, ids.shape[1]):  # the weight-only kernels, then the dequantized GEMM
            got, want = kept.model(ids[:, :n]).logits, dense.model(ids[:, :n]).logits
            assert (got - want).norm() / want.norm() < 0.02  # kept: 0.007-0.014; re-quantized int4/int8: 0.023-0.32


def test_held_dense_weights_give_the_same_bits_and_are_made_once(tmp_path, monkeypatch):
    """hold_dense keeps each layer's dequantized weight after its first prefill: later prefills
    reuse it (no dequantization) and give bit-identical logits, decode rows still run the
    weight-only kernel, and the fingerprint is the quantized model's."""
    from ragpic.core.model import load_model
    from ragpic.core.weights.linear import Int4Linear, hold_dense_weights

    monkeypatch.setenv("RAGPIC_HOME", str(tmp_path / "home"))
    path = tmp_path / "tiny-Q4_0.gguf"
    write_tiny_gguf(path, "qwen2", quant="Q4_0", num_key_value_heads=4)
    plain = load_model(str(path), device="cpu", dtype="bfloat16", weights="gguf", hold_dense=False)
    held = load_model(str(path), device="cpu", dtype="bfloat16", weights="gguf", hold_dense=True)
    assert held.fingerprint == plain.fingerprint and "held for prefill" in held.weights_summary
    assert "held" not in plain.weights_summary
    layers = [m for m in held.model.modules() if isinstance(m, Int4Linear)]
    assert layers and all(m._held is None for m in layers)
    ids = torch.arange(3, 3 + INT4_DENSE_FROM + 8)[None] % 200 + 3  # a prefill: the dense GEMM for both
    mid = ids[:, :DENSE_FROM + 8]  # held: the dense GEMM from 32 rows, int4 too; plain: the kernel
    calls = []
    for m in layers:
        m.dense_weight = (lambda f: lambda dtype: calls.append(1) or f(dtype))(m.dense_weight)
    with torch.no_grad():
        first = held.model(mid).logits
        made = len(calls)
        assert made == len(layers) and torch.equal(first, held.model(mid).logits)  # made once, reused
        assert torch.equal(held.model(ids).logits, plain.model(ids).logits) and len(calls) == made
        want = plain.model(mid).logits
        assert (first.float() - want.float()).norm() / want.float().norm() < 0.02  # GEMM against kernel: rounding
        torch.testing.assert_close(held.model(ids[:, :5]).logits, plain.model(ids[:, :5]).logits, rtol=0, atol=0)
    assert len(calls) == made  # a few rows: the kernel, not the dense copy
    assert all(m._held is not None and m._held.dtype == torch.bfloat16 for m in layers)
    assert hold_dense_weights(held.model, False) == len(layers) and all(m._held is None for m in layers)


def test_weight_names_are_checked_and_auto_resolves_by_machine():
    cpu, gpu = torch.device("cpu"), torch.device("cuda:0")
    assert parse_weights("int8") is WeightFormat.INT8
    with pytest.raises(ConfigError, match="weights must be one of"):
        parse_weights("int3")
    def auto(**kw):
        return resolve_weights(WeightFormat.AUTO, **kw)

    fmt, dtype, why = auto(gguf=True, device=cpu, dtype=None, cpu_bf16=True)
    assert (fmt, dtype) == (WeightFormat.GGUF, torch.bfloat16) and "native bf16" in why
    # without native bf16 (AVX2): int8 weights, an fp32 model, its decode rows through the kernel in bf16
    fmt, dtype, why = auto(gguf=True, device=cpu, dtype=None, cpu_bf16=False)
    assert (fmt, dtype) == (WeightFormat.INT8, torch.float32) and "without native bf16" in why
    assert auto(gguf=True, device=cpu, dtype=torch.float16, cpu_bf16=False)[:2] == (WeightFormat.DENSE, torch.float16)
    assert auto(gguf=False, device=cpu, dtype=None, cpu_bf16=True)[:2] == (WeightFormat.DENSE, None)
    assert auto(gguf=True, device=gpu, dtype=None)[0] is WeightFormat.DENSE
    assert resolve_weights(WeightFormat.INT8, gguf=True, device=cpu, dtype=None) == (WeightFormat.INT8, torch.bfloat16, "")
    with pytest.raises(ConfigError, match="must be a .gguf file"):
        resolve_weights(WeightFormat.GGUF, gguf=False, device=cpu, dtype=None)
    with pytest.raises(ConfigError, match="CPU kernels"):
        resolve_weights(WeightFormat.INT8, gguf=False, device=gpu, dtype=None)


def test_config_takes_a_weight_format_and_names_the_argument_when_wrong():
    from ragpic import Config

    assert Config(weights="int4").weights is WeightFormat.INT4 and Config().weights is WeightFormat.AUTO
    with pytest.raises(ConfigError, match="weights must be one of"):
        Config(weights="q4")
    with pytest.raises(ConfigError, match="hold_dense must be True, False or 'auto'"):
        Config(hold_dense="yes")
    assert Config().hold_dense is False  # the library stays near its file's memory; serve runs "auto"


def test_auto_holds_dense_copies_that_fit_a_quarter_of_memory(tmp_path, monkeypatch):
    """hold_dense='auto' holds a quantized model's dense copies when they fit a quarter of the
    machine's memory, says so, and never holds anything for dense weights."""
    from ragpic.core.model import load_model
    from ragpic.core.weights.linear import Int4Linear, dense_bytes
    from ragpic.core.weights.resolve import HOLD_DENSE_SHARE, resolve_hold_dense

    gb = 2**30
    hold, why = resolve_hold_dense("auto", quantized=True, dense_bytes=int(0.7 * gb), memory_bytes=24 * gb)
    assert hold and "0.7 GB, within 25% of 24 GB" in why
    hold, why = resolve_hold_dense("auto", quantized=True, dense_bytes=13 * gb, memory_bytes=24 * gb)
    assert not hold and "hold_dense=True forces them" in why
    assert resolve_hold_dense("auto", quantized=False, dense_bytes=gb, memory_bytes=24 * gb) == (False, "")
    assert resolve_hold_dense(True, quantized=True, dense_bytes=13 * gb, memory_bytes=gb) == (True, "")
    assert resolve_hold_dense(True, quantized=False, dense_bytes=gb) == (False, "")
    assert HOLD_DENSE_SHARE == 0.25
    with pytest.raises(ConfigError, match="hold_dense must be True, False or 'auto', got 'on'"):
        resolve_hold_dense("on", quantized=True, dense_bytes=gb)

    monkeypatch.setenv("RAGPIC_HOME", str(tmp_path / "home"))
    path = tmp_path / "tiny-Q4_0.gguf"
    write_tiny_gguf(path, "qwen2", quant="Q4_0", num_key_value_heads=4)
    lm = load_model(str(path), device="cpu", dtype="bfloat16", weights="gguf", hold_dense="auto")  # fits any machine
    layers = [m for m in lm.model.modules() if isinstance(m, Int4Linear)]
    assert layers and all(m.hold_dense for m in layers)
    default = load_model(str(path), device="cpu", dtype="bfloat16", weights="gguf")
    assert not any(m.hold_dense for m in default.model.modules() if isinstance(m, Int4Linear))
    assert "dense copies held" in lm.weights_summary and "held for prefill" in lm.weights_summary
    linears = [m for m in lm.model.modules() if isinstance(m, (Int4Linear, Int8Linear))]
    assert dense_bytes(lm.model, torch.bfloat16) == sum(m.out_features * m.in_features * 2 for m in linears)
