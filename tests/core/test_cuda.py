"""Checks that need a GPU (marker ``cuda``; they skip without one). scripts/gpu_check.sh runs
them and prints their summary; ``RAGPIC_TEST_DEVICE=cpu`` runs them on the CPU as a dry run
of the script (the backend, sync and pool checks then skip: they are CUDA's own).

Each check appends what it measured to ``$RAGPIC_GPU_REPORT`` (see ``device_checks.report``).
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from device_checks import (BF16_RTOL, bf16_ok, compare_to_reference, converted, method_prompts,
                           reference_attention, report)
from ragpic.core.kv import device_kv
from ragpic.core.decode import Sampling, decode_tokens
from ragpic.core.kv import ChunkKV
from ragpic.core.link import link
from ragpic.core.model import load_model
from ragpic.core.ops.attention import banded_sdpa, grouped_sdpa, plan_bands, query_bands
from ragpic.core.forward import additive_mask
from ragpic.core.ops.device import to_device
from ragpic.core.ops.linked_cache import SlabPool
from tiny import saved_tiny_model, tiny_lm

DEVICE = os.environ.get("RAGPIC_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else None)
pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(DEVICE is None, reason="needs a CUDA device (RAGPIC_TEST_DEVICE=cpu: dry run)")]
ON_CUDA = DEVICE is not None and DEVICE.startswith("cuda")
needs_cuda = pytest.mark.skipif(not ON_CUDA, reason="CUDA's own behaviour")

# (heads, kv_heads, rows, keys, head_dim): SmolLM2's 9/3 x 64, Llama-3-8B's 32/8 x 128, a decode row
SHAPES = [(9, 3, 48, 4096, 64), (32, 8, 160, 2048, 128), (9, 3, 1, 1000, 64), (4, 1, 33, 515, 64)]
TOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _backends():
    from torch.nn.attention import SDPBackend

    return {"efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "math": SDPBackend.MATH}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("backend", ["efficient", "cudnn", "math"])
def test_folded_heads_under_each_sdpa_backend(backend, shape, dtype):
    """On the real kernels: folded heads, masked, plain and banded, vs float64."""
    from torch.nn.attention import sdpa_kernel

    h, kv, r, n, d = shape
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, h, r, d, generator=gen), torch.randn(1, kv, n, d, generator=gen), torch.randn(
        1, kv, n, d, generator=gen)
    pos = torch.linspace(n // 3, n - 1, r).long() if r > 1 else torch.tensor([n - 1])
    mask = additive_mask(pos, n, dtype=torch.float32)
    ref = reference_attention(q, k, v, mask, d ** -0.5)
    dev = [x.to(DEVICE, dtype) for x in (q, k, v, mask)]
    plan = plan_bands(query_bands(pos.tolist(), call_cost=0), dev[3], groups=h // kv, fold=True)
    module = type("M", (), {"num_key_value_groups": h // kv, "is_causal": True, "training": False})()
    case = f"{backend} {shape} {str(dtype)[6:]}"
    try:
        with sdpa_kernel([_backends()[backend]]):
            out = grouped_sdpa(*dev, scaling=d ** -0.5, fold=True)
            banded, _ = banded_sdpa(module, *dev, scaling=d ** -0.5, ragpic_bands=plan)
    except RuntimeError as e:
        if "No viable backend" in str(e) or "No available kernel" in str(e):
            report(check="sdpa backend", case=case, result="unsupported", detail=str(e)[:60])
            pytest.skip(f"{backend} has no kernel for this case")
        raise
    err = (out.double().cpu() - ref).abs().max().item()
    err_banded = (banded.double().cpu() - ref.transpose(1, 2)).abs().max().item()
    ok = max(err, err_banded) <= TOL[dtype]
    report(check="sdpa backend", case=case, result="ok" if ok else "FAIL",
           detail=f"max err {err:.1e} / banded {err_banded:.1e}, output contiguous: {out.is_contiguous()}")
    assert ok


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_tiny_model_every_method_and_decode_in_bf16_vs_fp32_cpu(kind):
    ref = tiny_lm(kind, num_hidden_layers=3)
    ref.model.generation_config.eos_token_id = None
    lm = converted(ref, DEVICE, torch.bfloat16)
    _check_rows(f"tiny {kind}", compare_to_reference(lm, ref))


def test_smollm2_every_method_and_decode_in_bf16_vs_fp32_cpu():
    try:
        ref = load_model(device="cpu")
    except (FileNotFoundError, ImportError) as e:
        report(check="SmolLM2 bf16", case="-", result="skipped", detail=f"model not here: {e}"[:80])
        pytest.skip(f"SmolLM2 is not available here: {e}")
    lm = load_model(device=DEVICE, dtype=torch.bfloat16)
    _check_rows("SmolLM2", compare_to_reference(lm, ref))


def _check_rows(model: str, rows: list[dict]) -> None:
    for r in rows:
        report(check=f"{model} bf16", case=r["method"], result="ok" if bf16_ok(r) else "FAIL",
               detail=f"rel {r['rel']:.3f} (<= {BF16_RTOL}), top1 {r['top1']}, "
                      f"decode agree {r['decode_agree']:.2f}, {r['tokens']} tokens")
    assert all(bf16_ok(r) for r in rows), rows


@needs_cuda
def test_sync_count_of_a_link_and_a_decode_step():
    """A link syncs only for its timing (and CacheBlend's one selection read);
    a greedy decode step syncs once, to read its token."""
    lm = converted(tiny_lm("llama", num_hidden_layers=3), DEVICE, torch.bfloat16)
    lm.model.generation_config.eos_token_id = None
    prompts = method_prompts(lm)
    for m in ("full", "naive", "legolink-2", "cacheblend-30", "legolink-0"):
        segs = prompts["bos4" if m == "legolink-0" else "plain"]
        link(lm, segs, m, extra_capacity=4)  # warm: first-call allocations are not the path
        res, link_syncs = _counting_syncs(lambda: link(lm, segs, m, extra_capacity=4))
        tokens = decode_tokens(lm, res.cache, res.logits, res.num_tokens, Sampling(max_new_tokens=4))
        next(tokens)
        _, step_syncs = _counting_syncs(lambda: next(tokens))
        report(check="syncs", case=m, result="ok" if link_syncs <= 3 and step_syncs == 1 else "FAIL",
               detail=f"link {link_syncs} (timing 2 + cacheblend 1 allowed), decode step {step_syncs}")
        assert link_syncs <= 3 and step_syncs == 1, (m, link_syncs, step_syncs)


def _counting_syncs(fn):
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return out, sum("synchroniz" in str(w.message) for w in caught)


@needs_cuda
def test_pool_reuses_cuda_memory_across_device_spellings_after_its_event():
    """The slab pool: "cuda" matches "cuda:0", and a released slab carries an event."""
    pool = SlabPool()
    first = pool.cache(2, 2, 16, 64, dtype=torch.bfloat16, device="cuda")
    ptr = first.key_slab.data_ptr()
    first.key_slab.normal_()  # queued work on the slab
    pool.release(first)
    (_, event), = list(pool._returned)
    assert isinstance(event, torch.cuda.Event)
    indexed = torch.device("cuda", torch.cuda.current_device())
    again = pool.cache(2, 2, 16, 32, dtype=torch.bfloat16, device=indexed)
    report(check="slab pool", case="cuda vs cuda:N", result="ok" if again.key_slab.data_ptr() == ptr else "FAIL",
           detail="reused after its release event")
    assert again.key_slab.data_ptr() == ptr


def test_int8_kv_dequantized_on_the_device_equals_the_store():
    """int8 + scales cross to the device; the values equal the store's CPU decode."""
    from ragpic.core.kv import dequantize_int8, quantize_int8

    x = torch.randn(3, 2, 40, 64) * 4
    (qk, sk), (qv, sv) = quantize_int8(x), quantize_int8(x * 0.5)
    kv = ChunkKV(torch.arange(40), qk, qv, 0, "fp", key_scales=sk, value_scales=sv, quant_dtype=torch.bfloat16)
    keys, values = device_kv(kv, torch.device(DEVICE))
    same = torch.equal(keys.cpu(), dequantize_int8(qk, sk, torch.float32)) and torch.equal(
        values.cpu(), dequantize_int8(qv, sv, torch.bfloat16))
    report(check="int8 on device", case="dequantize", result="ok" if same else "FAIL",
           detail=f"{kv.nbytes} B moved vs {2 * x.numel() * 2} B bf16")
    assert same and values.dtype == torch.bfloat16 and str(keys.device).startswith(DEVICE)


def test_pinned_copies_and_loading_straight_to_the_device(tmp_path):
    """Host data goes over pinned, weights load on the device in its dtype."""
    host = torch.randn(1000)
    dev = to_device(host, torch.device(DEVICE))
    assert torch.equal(dev.cpu(), host)
    lm = load_model(str(saved_tiny_model(tmp_path / "m")), device=DEVICE)
    devices = {p.device for p in lm.model.parameters()}
    want = torch.device(DEVICE)
    if want.type == "cuda" and want.index is None:  # tensors report an indexed device
        want = torch.device("cuda", torch.cuda.current_device())
    dtypes = (torch.bfloat16, torch.float16) if ON_CUDA else (torch.float32,)
    report(check="load_model", case=DEVICE, result="ok" if devices == {want} and lm.dtype in dtypes else "FAIL",
           detail=f"weights on {sorted(map(str, devices))}, dtype {lm.dtype}, banded {lm.banded_attention}")
    assert devices == {want} and lm.device == want  # every weight, and the model's device, where asked
    assert lm.dtype in dtypes
