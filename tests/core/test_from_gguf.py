"""A GGUF converted a tensor at a time (ragpic.core.weights.from_gguf): the dense folder is bit for
bit what transformers' own GGUF reader builds, the int8/int4 ones what quantizing that model gives,
the file's own blocks are kept within round-off of it, slicing a tensor changes no bit, and
transformers never reads the whole model."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import ragpic.core.weights.from_gguf as from_gguf
import ragpic.core.weights.linear as linear
from ragpic.core.gguf import convert_gguf, folder_name
from ragpic.core.model import load_model
from ragpic.core.weights import WeightFormat
from ragpic.core.weights.apply import quantize_model
from ragpic.core.weights.linear import Int4Embedding, Int4Linear, Int8Embedding, Int8Linear, pack_block
from ragpic.errors import UnsupportedModelError
from tiny_gguf import write_tiny_gguf

# a Q4_K_M file mixes types: 4-bit blocks kept, 8-bit ones re-quantized, a tied head
MIXED = {"ffn_down": "Q8_0", "token_embd": "Q8_0", "": "Q4_0"}


def _reference(path, dtype):
    """The whole model as transformers' own GGUF reader builds it."""
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGPIC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind,quant,tied,overrides", [
    ("qwen2", None, False, {}),                 # fp32 tensors, QKV biases
    ("llama", "Q8_0", False, {}),               # llama.cpp's Q/K row order
    ("llama", MIXED, True, {}),                 # mixed types, the head tied to the embedding
    ("qwen3", "Q4_1", False, {"head_dim": 128}),  # q/k norms
])
def test_the_dense_folder_is_bit_for_bit_transformers_own(tmp_path, kind, quant, tied, overrides, dtype):
    path = tmp_path / f"{kind}.gguf"
    write_tiny_gguf(path, kind, quant=quant, tied=tied, **overrides)
    target = convert_gguf(path, tmp_path / "dense", dtype)
    ref = _reference(path, dtype).state_dict()
    got = AutoModelForCausalLM.from_pretrained(target, dtype=dtype).state_dict()
    assert got.keys() == ref.keys()
    for key in ref:
        assert got[key].dtype == dtype and torch.equal(got[key], ref[key]), key


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_int8_and_int4_from_a_gguf_are_the_quantized_reference_bit_for_bit(tmp_path, home, fmt):
    """What the first load used to do whole (dequantize the model, then quantize it), now a
    tensor at a time: the same buffers."""
    path = tmp_path / "m.gguf"
    write_tiny_gguf(path, "llama", quant=MIXED, tied=True, num_key_value_heads=4)
    lm = load_model(str(path), device="cpu", weights=fmt)
    ref = _reference(path, torch.bfloat16)
    quantize_model(ref, WeightFormat(fmt))
    got, want = lm.model.state_dict(), ref.state_dict()
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key
    assert lm.model.dtype == torch.bfloat16 and f"weights {fmt}:" in lm.weights_summary
    # a later load reads the folder back into 64-byte aligned memory, not the file's map (the
    # int4 kernel reads mapped, 8-byte aligned weights ~1.5x slower)
    again = load_model(str(path), device="cpu", weights=fmt).model.state_dict()
    assert all(t.data_ptr() % 64 == 0 for t in again.values() if t.numel() >= 16)


def test_the_files_own_blocks_are_kept_and_the_rest_requantized_near_the_reference(tmp_path, home):
    """weights='gguf': a Q4_0 weight is the file's codes (the dequantized model's weight to the
    rounding of its bf16 scales), an 8-bit one is re-quantized (within 4-bit error), llama's rows
    are in transformers' order, and the tied head reads the embedding."""
    path = tmp_path / "m.gguf"
    write_tiny_gguf(path, "llama", quant=MIXED, tied=True, num_key_value_heads=4)
    lm = load_model(str(path), device="cpu", dtype="float32", weights="gguf")
    ref = dict(_reference(path, torch.float32).named_modules())
    kinds = {}
    for name, mod in lm.model.named_modules():
        if isinstance(mod, (Int4Linear, Int8Linear)):
            want = ref[name].weight.detach()
            err = (mod.dense_weight(torch.float32) - want).norm() / want.norm()
            exact = isinstance(mod, Int4Linear) and "down_proj" not in name and name != "lm_head"
            assert (err <= 5e-3) if exact else (0.01 < err <= 0.1), (name, float(err))
            kinds[name] = type(mod)
    assert kinds["lm_head"] is Int4Linear and kinds["model.layers.0.self_attn.q_proj"] is Int4Linear
    assert isinstance(lm.model.model.embed_tokens, Int8Embedding)  # Q8_0: re-quantized to int8
    assert "int4 exact Q4_0" in lm.weights_summary and "int4 from Q8_0" in lm.weights_summary


def _convert_and_load(path, target, fmt: str) -> dict[str, torch.Tensor]:
    from transformers import AutoConfig

    from ragpic.core.weights.saved import load_saved

    convert_gguf(path, target, torch.bfloat16, fmt=WeightFormat(fmt))
    if fmt == "dense":
        return AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16).state_dict()
    return load_saved(target, AutoConfig.from_pretrained(target), torch.bfloat16)[0].state_dict()


@pytest.mark.parametrize("fmt", ["dense", "gguf", "int8", "int4"])
def test_slicing_a_tensor_changes_no_bit(tmp_path, monkeypatch, fmt):
    """Large tensors are read, dequantized and packed a slice of rows at a time; tiny slices here."""
    path = tmp_path / "m.gguf"
    write_tiny_gguf(path, "llama", quant={"token_embd": "Q4_1", "ffn_down": "Q8_0", "": "Q4_0"},
                    num_key_value_heads=4)
    whole = _convert_and_load(path, tmp_path / "whole", fmt)
    monkeypatch.setattr(from_gguf, "SLICE_BYTES", 64 * 64 * 4)
    monkeypatch.setattr(linear, "_PACK_ROWS", 64)
    with from_gguf.GGUFTensors(path) as file:
        assert len(file.slices(file.tensors["token_embd.weight"])) == 5  # 320 rows, 64 at a time
    sliced = _convert_and_load(path, tmp_path / "sliced", fmt)
    assert whole.keys() == sliced.keys()
    for key in whole:
        assert torch.equal(whole[key], sliced[key]), key


def test_transformers_never_reads_the_whole_model(tmp_path, home, monkeypatch):
    import transformers.modeling_gguf_pytorch_utils as reader

    real, calls = reader.load_gguf_checkpoint, []

    def spy(*args, return_tensors=False, **kwargs):
        calls.append(return_tensors)
        return real(*args, return_tensors=return_tensors, **kwargs)

    monkeypatch.setattr(reader, "load_gguf_checkpoint", spy)
    path = tmp_path / "m.gguf"
    write_tiny_gguf(path, "qwen2", quant="Q4_0", num_key_value_heads=4)
    for fmt in ("gguf", "dense"):
        load_model(str(path), device="cpu", weights=fmt)
    assert calls and not any(calls)  # the header, for the config and the tokenizer; never the tensors
    folders = sorted(p.name for p in (home / "models" / "gguf").iterdir() if p.is_dir() and p.name != "sha256")
    assert len(folders) == 2 and any(f.endswith(f"-gguf-b{pack_block()}-v2") for f in folders)


def test_a_tensor_ragpic_does_not_map_is_refused_and_nothing_is_cached(tmp_path, home):
    import numpy as np

    path = tmp_path / "odd.gguf"
    write_tiny_gguf(path, "qwen2", extra={"blk.0.attn_gate.weight": np.ones((64, 64), np.float32)})
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.attn_gate\.weight: a GGUF tensor ragpic does not map"):
        load_model(str(path), device="cpu", weights="dense")
    assert not [p for p in (home / "models" / "gguf").iterdir() if p.name != "sha256"]  # no folder, no leftovers


def test_the_folder_is_keyed_by_content_format_dtype_and_this_cpus_int4_layout():
    """The kernel's int4 layout depends on the ISA torch dispatches to (64-row blocks with AVX-512,
    32 with AVX2): a model saved packed on one machine is never mapped back on another."""
    block = pack_block()
    assert block in (64, 32, 16, 8, 4, 2)
    assert (torch.backends.cpu.get_cpu_capability() != "AVX2") or block == 32
    digest = "ab" * 32
    assert folder_name("m", digest, WeightFormat.DENSE, torch.float32) == "m-abababababababab-float32"
    assert folder_name("m", digest, WeightFormat.GGUF, torch.bfloat16) == f"m-abababababababab-bfloat16-gguf-b{block}-v2"
    assert folder_name("m", digest, WeightFormat.INT4, torch.bfloat16) == f"m-abababababababab-bfloat16-int4-b{block}-v2"
    assert folder_name("m", digest, WeightFormat.INT8, torch.bfloat16) == "m-abababababababab-bfloat16-int8-v2"
    # an fp32 model's quantized layers keep bf16 scales (kernel_dtype): a layout of its own
    assert folder_name("m", digest, WeightFormat.GGUF, torch.float32) == f"m-abababababababab-float32-gguf-b{block}-v3"


def test_an_embedding_kept_in_4_bit_blocks_looks_up_the_files_rows(tmp_path, home):
    path = tmp_path / "m.gguf"
    write_tiny_gguf(path, "qwen2", quant="Q4_0", num_key_value_heads=4)
    lm = load_model(str(path), device="cpu", dtype="float32", weights="gguf")
    emb = lm.model.model.embed_tokens
    assert isinstance(emb, Int4Embedding)
    want = _reference(path, torch.float32).model.embed_tokens.weight
    torch.testing.assert_close(emb(torch.arange(320)), want, rtol=0, atol=1e-6)
