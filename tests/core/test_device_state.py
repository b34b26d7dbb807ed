"""Device state around link, on the CPU (docs/RESULTS.md §7): decode buffers, CacheBlend's masks, the
slab pool's stream events and device names, dtype choice, loading straight to the device,
and bf16 links held to a bf16 tolerance plus top-1 agreement."""

from __future__ import annotations

import contextlib

import pytest
import torch

from device_checks import BF16_RTOL, bf16_ok, compare_to_reference, converted
from prompts import compile_texts, linked_prompt
from ragpic.core import forward
from ragpic.core.decode import DecodeBuffers
from ragpic.core.link import link
from ragpic.core.model import default_dtype, load_kwargs, load_model, resolve_device
from ragpic.core.ops import attention
from ragpic.core.forward import additive_mask
from ragpic.core.ops.device import normalize_device
from ragpic.core.ops.linked_cache import SlabPool
from tiny import saved_tiny_model, tiny_lm


# ----------------------------------------------------------------------------- decode
@pytest.mark.parametrize("window", [None, 5, 64])
def test_decode_mask_buffer_equals_a_mask_built_per_step(window):
    lm = tiny_lm("mistral", sliding_window=window) if window else tiny_lm("llama")
    bufs = DecodeBuffers(lm, prompt_len=37, steps=12)
    assert bufs.mask.shape[-1] % 16 == 0
    for i in range(12):
        p = 37 + i
        want = additive_mask(torch.tensor([p]), p + 1, dtype=lm.dtype, sliding_window=window)
        assert torch.equal(bufs.step_mask(i), want), i
        assert int(bufs.positions[i]) == p


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_decode_steps_pass_no_bands_and_build_no_mask(monkeypatch, kind):
    """Decode steps build no mask: the lean step (llama) no forward step at all; the generic
    forward (gemma) a one-row step with the buffer's mask view and no bands."""
    lm = tiny_lm(kind, num_hidden_layers=2)
    lm.model.generation_config.eos_token_id = None
    segs = linked_prompt(lm, compile_texts(lm))
    res = link(lm, segs, "legolink-2", extra_capacity=4)
    from ragpic.core.decode import Sampling, decode_tokens

    seen, built = [], []
    real_step, real_mask = forward.step_inputs, forward.additive_mask
    monkeypatch.setattr(forward, "step_inputs", lambda *a, **k: seen.append(real_step(*a, **k)) or seen[-1])
    monkeypatch.setattr(forward, "additive_mask", lambda *a, **k: built.append(1) or real_mask(*a, **k))
    from ragpic.core import runner

    monkeypatch.setattr(runner, "step_inputs", forward.step_inputs)
    tokens = list(decode_tokens(lm, res.cache, res.logits, res.num_tokens, Sampling(max_new_tokens=4)))
    assert len(tokens) == 4 and len(seen) == (0 if kind == "llama" else 3) and built == []
    assert all(step.plan is None and step.mask.shape[-2] == 1 for step in seen)


# ----------------------------------------------------------------------------- CacheBlend
@pytest.mark.parametrize("attn,window", [("sdpa", None), ("eager", None), ("sdpa", 8)])
def test_cacheblend_builds_step_inputs_twice_and_no_n_by_n_mask_when_sdpa_can_mask(attn, window, monkeypatch):
    """CacheBlend: inputs once for layers 0-1 (causal kernel, no mask, when it can), once for the rest."""
    kind, kw = ("mistral", {"sliding_window": window}) if window else ("llama", {})
    lm = tiny_lm(kind, attn=attn, num_hidden_layers=5, **kw)
    segs = linked_prompt(lm, compile_texts(lm))
    n = sum(s.num_tokens for s in segs)
    calls, masks = [], []
    real_step, real_mask = forward.step_inputs, forward.additive_mask
    monkeypatch.setattr(forward, "step_inputs",
                        lambda *a, **k: calls.append(k.get("causal")) or real_step(*a, **k))
    monkeypatch.setattr(forward, "additive_mask", lambda pos, length, **k: masks.append(pos.numel()) or real_mask(
        pos, length, **k))
    from ragpic.core.link import cacheblend

    monkeypatch.setattr(cacheblend, "step_inputs", forward.step_inputs)
    cb = link(lm, segs, "cacheblend-30")
    assert calls == [True, None]
    assert (n in masks) == (attn == "eager" or window is not None) and masks.count(n) <= 1
    monkeypatch.undo()
    assert torch.equal(cb.logits, link(lm, segs, "cacheblend-30").logits)
    assert (link(lm, segs, "cacheblend-100").logits - link(lm, segs, "full").logits).abs().max() <= 1e-4


# ----------------------------------------------------------------------------- slab pool
def test_pool_waits_for_the_release_event_before_reusing_memory():
    """The pool on CUDA streams: release records an event on the stream; the next user's stream waits for it."""
    log = []
    pool = SlabPool(record=lambda dev: log.append(("record", str(dev))) or f"event{len(log)}",
                    wait=lambda ev, dev: log.append(("wait", ev)))
    first = pool.cache(2, 2, 16, 50, dtype=torch.float32, device="cpu")
    assert log == []  # fresh memory: nothing to wait for
    pool.release(first)
    again = pool.cache(2, 2, 16, 40, dtype=torch.float32, device=torch.device("cpu"))
    assert log == [("record", "cpu"), ("wait", "event1")]
    pool.release(again)
    assert pool.idle_bytes == 2 * 2 * 2 * 50 * 16 * 4


def test_cuda_and_cuda_0_are_one_device():
    assert normalize_device("cuda", current_index=lambda t: 0) == torch.device("cuda:0")
    assert normalize_device("cuda:1", current_index=lambda t: 0) == torch.device("cuda:1")
    assert normalize_device("meta") == torch.device("meta") and normalize_device("cpu") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


# ----------------------------------------------------------------------------- dtype and loading
def test_bf16_only_where_the_gpu_runs_it_natively(monkeypatch):
    """dtype choice: emulated bf16 (T4, V100) is not bf16 support: those get fp16."""
    asked = []

    def emulated_only(including_emulation=True):  # a T4: bf16 only through emulation
        asked.append(including_emulation)
        return including_emulation

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", emulated_only)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    assert default_dtype(torch.device("cuda:0")) == torch.float16 and asked == [False]
    assert default_dtype(torch.device("cuda:0"), bf16_native=True) == torch.bfloat16
    assert default_dtype(torch.device("cpu")) == torch.float32


def test_load_model_puts_weights_on_the_device_without_moving_them(tmp_path, monkeypatch):
    """Loading straight to the device: from_pretrained gets device_map and dtype; no Module.to pass afterwards."""
    assert load_kwargs(torch.device("cuda:0"), torch.bfloat16) == {"dtype": torch.bfloat16, "device_map": "cuda:0"}
    folder = saved_tiny_model(tmp_path / "m")
    calls = []
    real_to = torch.nn.Module.to
    monkeypatch.setattr(torch.nn.Module, "to",
                        lambda self, *a, **k: calls.append(a or k) or real_to(self, *a, **k))
    lm = load_model(str(folder), device="cpu", dtype="bfloat16")
    assert calls == [] and lm.dtype == torch.bfloat16 and lm.device == torch.device("cpu")
    assert lm.banded_attention


# ----------------------------------------------------------------------------- bf16
@pytest.mark.parametrize("kind,kw", [("llama", {}), ("qwen2", {}), ("mistral", {"sliding_window": 16}),
                                     ("gemma", {})])
def test_bf16_links_match_fp32_within_bf16_tolerance_and_top1(kind, kw):
    """bf16 links: every method plus 8 greedy tokens, bf16 (CPU) against the fp32 model."""
    ref = tiny_lm(kind, num_hidden_layers=3, **kw)
    ref.model.generation_config.eos_token_id = None
    lm = converted(ref, "cpu", torch.bfloat16)
    rows = compare_to_reference(lm, ref)
    assert all(bf16_ok(r) for r in rows), rows
    assert all(r["tokens"] == 8 for r in rows)


def test_bf16_tolerance_catches_a_wrong_link(monkeypatch):
    """The bf16 bound is tight enough to see a real bug: keys left unrotated fail it."""
    ref = tiny_lm("llama", num_hidden_layers=3)
    ref.model.generation_config.eos_token_id = None
    lm = converted(ref, "cpu", torch.bfloat16)
    from ragpic.core.link import plan as cache_fill

    real = cache_fill.rotate_keys
    monkeypatch.setattr(cache_fill, "rotate_keys", lambda keys, delta, inv_freq, out: out.copy_(keys)
                        if out.dtype == torch.bfloat16 else real(keys, delta, inv_freq, out=out))  # bf16 only
    rows = compare_to_reference(lm, ref, methods=("legolink-2",))
    assert rows[0]["rel"] > BF16_RTOL or not rows[0]["top1"], rows


def test_bf16_with_folded_heads_matches_fp32(monkeypatch):
    """The GPU's attention layout (heads folded into rows) in bf16."""
    ref = tiny_lm("qwen2", num_hidden_layers=3)
    ref.model.generation_config.eos_token_id = None
    lm = converted(ref, "cpu", torch.bfloat16)
    real_plan = attention.plan_bands
    monkeypatch.setattr(attention, "plan_bands", lambda bands, mask, groups, fold, **kw: real_plan(
        bands, mask, groups=groups, fold=True, **kw))
    monkeypatch.setattr(attention, "CALL_COST", 0)  # many bands, several of them folded and masked
    rows = compare_to_reference(lm, ref, methods=("legolink-2", "naive", "cacheblend-30"))
    assert all(bf16_ok(r) for r in rows), rows


def test_auto_dtype_is_bf16_only_on_a_cpu_with_native_bf16(monkeypatch):
    """``dtype="auto"`` (docs/RESULTS.md §8) asks torch's CPU probe (AVX512_BF16 or AMX) and the
    capability torch dispatches to (an AVX2 dispatch has no bf16 kernels), never guesses."""
    from ragpic.core.ops import device as device_mod

    cpu = torch.device("cpu")
    assert device_mod.auto_dtype(cpu, cpu_bf16=True) == torch.bfloat16
    assert device_mod.auto_dtype(cpu, cpu_bf16=False) == torch.float32
    for avx512_bf16, amx, want in ((True, False, True), (False, True, True), (False, False, False)):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        assert device_mod.cpu_bf16_native() is want
        assert device_mod.auto_dtype(cpu) == (torch.bfloat16 if want else torch.float32)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    for capability, want in (("AVX512", True), ("AVX2", False), ("DEFAULT", False)):  # what torch dispatches to
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
        assert device_mod.cpu_bf16_native() is want, capability
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: not including_emulation)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    assert device_mod.auto_dtype(torch.device("cuda:0")) == torch.bfloat16  # a GPU: as the default


def test_config_takes_auto_and_names_the_choices():
    from ragpic import Config
    from ragpic.errors import ConfigError

    assert Config(dtype="auto").dtype == "auto"
    with pytest.raises(ConfigError, match="dtype must be .*auto"):
        Config(dtype="bf16")


def test_a_bf16_engine_never_reads_entries_an_fp32_engine_stored(tmp_path):
    """The same weights in bf16 and fp32 have two fingerprints (ARCHITECTURE.md §4.4), so two keys per chunk:
    sharing one store folder, the bf16 engine compiles its own KV instead of linking fp32 KV."""
    from prompts import CHUNKS
    from ragpic import Config, RagPic
    from tiny import tiny_lm

    lm32 = tiny_lm("llama", num_hidden_layers=2)
    lm16 = converted(lm32, "cpu", torch.bfloat16)
    assert lm16.fingerprint != lm32.fingerprint
    store = str(tmp_path / "kv")
    e32 = RagPic(Config(store=store, device="cpu"), lm=lm32)
    e32.compile(CHUNKS[:1])
    e16 = RagPic(Config(store=store, device="cpu"), lm=lm16)
    assert e16.chunk_key(CHUNKS[0]) != e32.chunk_key(CHUNKS[0])
    g = e16.generate(CHUNKS[0] + " what did the fox do?", chat=False, hints=CHUNKS[:1], max_new_tokens=2)
    assert (g.chunks_loaded, g.chunks_compiled) == (0, 1)
    g = e32.generate(CHUNKS[0] + " what did the fox do?", chat=False, hints=CHUNKS[:1], max_new_tokens=2)
    assert (g.chunks_loaded, g.chunks_compiled) == (1, 0)
    e32.store.close(), e16.store.close()


def test_an_avx2_dispatch_is_taken_as_an_avx2_cpu():
    """Under ``ATEN_CPU_CAPABILITY=avx2`` (how an AVX2 machine is emulated on this one) the
    weights ``auto`` picks are the AVX2 machine's: no native bf16, so an fp32 model on int8
    weights, whatever the silicon."""
    import os
    import subprocess
    import sys

    code = ("import torch; from ragpic.core.ops.device import cpu_bf16_native; "
            "from ragpic.core.weights.resolve import resolve_weights; from ragpic.core.weights.formats import WeightFormat; "
            "print(torch.backends.cpu.get_cpu_capability(), cpu_bf16_native(), "
            "resolve_weights(WeightFormat.AUTO, gguf=True, device=torch.device('cpu'), dtype=None)[0].value)")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["AVX2", "False", "int8"], out.stdout
