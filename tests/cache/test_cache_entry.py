"""Entry format and keys: bit-exact round trips, the int8 error bound, damage detection."""

from __future__ import annotations

import struct

import pytest
import torch

from cache_helpers import FP, make_chunk, same_kv
from ragpic.cache import CorruptEntry, ForeignEntry, chunk_key
from ragpic.cache.format.entry import decode, encode
from ragpic.cache.format.keys import dtype_name

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_is_bit_exact(dtype: torch.dtype) -> None:
    _, kv, text = make_chunk(1, tokens=37, layers=3, heads=2, head_dim=64, dtype=dtype, recipe="bos1", base_position=1)
    kv2, text2 = decode(encode(kv, text=text), fingerprint=FP)
    assert same_kv(kv, kv2) and text2 == text
    kv2.keys.add_(1)  # decoded tensors own writable memory
    assert not torch.equal(kv.keys, kv2.keys)


def test_empty_chunk_round_trips() -> None:
    _, kv, text = make_chunk(2, tokens=0)
    assert same_kv(decode(encode(kv, text=""), fingerprint=FP)[0], kv)


@pytest.mark.parametrize("dtype", DTYPES)
def test_int8_error_is_within_stated_bound(dtype: torch.dtype) -> None:
    _, kv, text = make_chunk(3, tokens=64, layers=2, heads=3, head_dim=64, dtype=dtype)
    # rows spanning 9 orders of magnitude, incl. ones whose fp16 scale is subnormal
    mag = torch.logspace(-6, 3, 64).view(1, 1, 64, 1)
    kv = type(kv)(kv.token_ids, (kv.keys.float() * mag).to(dtype), (kv.values.float() * mag).to(dtype),
                  0, FP, "plain")
    raw, _ = decode(encode(kv, text=text, quant="int8"), fingerprint=FP)
    assert raw.is_quantized and raw.keys.dtype == torch.int8 and raw.dtype == dtype  # stays int8 until link
    out = raw.to("cpu", dtype)  # link's dequantization, on its device
    assert out.keys.dtype == dtype and out.values.dtype == dtype
    for orig, back in ((kv.keys, out.keys), (kv.values, out.values)):
        x, y = orig.float(), back.float()
        amax = x.abs().amax(-1, keepdim=True)
        err = (y - x).abs()
        assert bool((err <= amax / 127).all()), float((err / amax).max())  # the documented bound
        if dtype == torch.float32:  # tight bound before any cast back to a 16-bit dtype
            assert bool((err <= amax / 254 * (1 + 2**-7) * (1 + 2**-20)).all())


def test_int8_entry_is_about_half_of_fp16() -> None:
    _, kv, text = make_chunk(4, tokens=512, layers=4, heads=3, head_dim=64, dtype=torch.float16)
    fp16, int8 = len(encode(kv, text=text)), len(encode(kv, text=text, quant="int8"))
    assert 0.50 < int8 / fp16 < 0.53


def test_int8_refuses_non_finite_kv() -> None:
    _, kv, text = make_chunk(5)
    kv.keys[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        encode(kv, text=text, quant="int8")


def _good() -> bytes:
    _, kv, text = make_chunk(6, tokens=16)
    return encode(kv, text=text)


@pytest.mark.parametrize("cut", [0, 3, 25, 60, -1, -100])
def test_truncation_is_detected(cut: int) -> None:
    data = _good()
    with pytest.raises(CorruptEntry, match="truncated|short|payload"):
        decode(data[:cut] if cut else b"", fingerprint=FP)


@pytest.mark.parametrize("where", ["header", "payload_start", "payload_end"])
def test_bit_flips_are_detected(where: str) -> None:
    data = bytearray(_good())
    pos = {"header": 40, "payload_start": len(data) - 4000, "payload_end": len(data) - 1}[where]
    data[pos] ^= 0x10
    with pytest.raises(CorruptEntry, match="checksum"):
        decode(bytes(data), fingerprint=FP)


def test_bad_magic_version_and_padding_are_detected() -> None:
    data = _good()
    with pytest.raises(CorruptEntry, match="magic"):
        decode(b"XXXX" + data[4:], fingerprint=FP)
    with pytest.raises(CorruptEntry, match="version 9"):
        decode(data[:4] + struct.pack("<H", 9) + data[6:], fingerprint=FP)
    with pytest.raises(CorruptEntry, match="padded"):
        decode(data + b"\0", fingerprint=FP)


def test_foreign_fingerprint_is_refused() -> None:
    _, kv, text = make_chunk(7, fingerprint="other-model")
    with pytest.raises(ForeignEntry, match="other-model"):
        decode(encode(kv, text=text), fingerprint=FP)


def test_chunk_key_is_content_addressed() -> None:
    base = chunk_key(FP, "hello", "plain", "float16")
    assert base == chunk_key(FP, "hello", "plain", torch.float16) == chunk_key(FP, "hello", "plain", "fp16")
    # 64 lowercase hex (what a folder store accepts as an entry name), and the same digest in
    # every version: stored entries are found by this key, so a new derivation orphans them all
    assert len(base) == 64 and set(base) <= set("0123456789abcdef")
    assert base == "6b9f2c4528580cf1ce15b28e6acbc52c1fb43f37a25b186e6e8f64d655e5bcaf"
    variants = [chunk_key("fp2", "hello", "plain", "float16"), chunk_key(FP, "hello ", "plain", "float16"),
                chunk_key(FP, "hello", "bos1", "float16"), chunk_key(FP, "hello", "plain", "bfloat16")]
    assert len({base, *variants}) == 5
    assert chunk_key("ab", "c", "plain", "fp32") != chunk_key("a", "bc", "plain", "fp32")  # length-prefixed
    with pytest.raises(ValueError, match="unsupported KV dtype"):
        dtype_name("int8")


@pytest.mark.parametrize("tokens", [1, 63, 64, 130])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_error_is_within_its_group_scale(tokens: int, dtype: torch.dtype) -> None:
    """int4 (docs/RESULTS.md §1): every element within half its group's step (keys per channel and 64-token
    group, values per token), an outlier channel included; decoded to float KV in the dtype."""
    from ragpic.cache.format.int4 import GROUP

    key, kv, text = make_chunk(3, tokens=tokens, dtype=dtype, head_dim=64)
    kv.keys[..., 5] += 40  # an outlier channel, as real keys have
    data = encode(kv, text=text, quant="int4")
    out, back_text = decode(data, fingerprint=FP)
    assert back_text == text and not out.is_quantized and out.keys.dtype == dtype and torch.equal(out.token_ids, kv.token_ids)
    k, v = kv.keys.float(), kv.values.float()
    span_k = (k.amax(2, keepdim=True) - k.amin(2, keepdim=True)) if tokens <= GROUP else None
    err_k, err_v = (out.keys.float() - k).abs(), (out.values.float() - v).abs()
    step_v = (v.amax(-1, keepdim=True) - v.amin(-1, keepdim=True)) / 15 + v.amin(-1, keepdim=True).abs() / 2**7
    ulp = 2**-8 if dtype == torch.bfloat16 else 1e-6  # the final cast to the entry's dtype
    assert bool((err_v <= step_v / 2 * (1 + 2**-7) + ulp * v.abs() + 1e-6).all())
    if span_k is not None:  # one key group: its bound in closed form
        step_k = span_k / 15 + k.amin(2, keepdim=True).abs() / 2**7
        assert bool((err_k <= step_k / 2 * (1 + 2**-7) + ulp * k.abs() + 1e-6).all())
    # per channel, the outlier does not coarsen the other channels: a per-token step here would be
    # ~(40 + 3 x 3) / 15 = 3.3, an error up to ~1.6; the other channels' steps are ~(2 x 3 x 3) / 15
    assert float(err_k[..., :5].max()) < 0.8


def test_int4_entry_is_about_a_seventh_of_fp32_and_refuses_what_it_cannot_hold() -> None:
    _, kv, text = make_chunk(4, tokens=512, layers=2, heads=2, head_dim=64)
    fp32, int8, int4 = (len(encode(kv, text=text, quant=q)) for q in ("none", "int8", "int4"))
    assert 0.13 < int4 / fp32 < 0.15 and int4 < 0.6 * int8
    _, odd, text = make_chunk(5, tokens=8, head_dim=15)
    with pytest.raises(ValueError, match="even head_dim"):
        encode(odd, text=text, quant="int4")
    _, bad, text = make_chunk(6, tokens=8)
    bad.values[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        encode(bad, text=text, quant="int4")
    # int8 KV (read from an int8 store) is written as int4 from the floats it stands for
    i8, _ = decode(encode(kv, text=text, quant="int8"), fingerprint=FP)
    back, _ = decode(encode(i8, text=text, quant="int4"), fingerprint=FP)
    assert back.keys.dtype == torch.float32 and (back.values - kv.values).abs().max() < 0.5
