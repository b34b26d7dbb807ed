"""``benchmarks/synth_gguf.py``: a random-weight GGUF of a model's geometry in the Q4_K_M type mix,
written straight from random blocks, which ragpic loads and runs (the ``tiny`` preset, ~28 MB).

Needs the pinned Qwen2.5-Coder-0.5B GGUF for its tokenizer (``ragpic model get qwen2.5-coder-0.5b``)
and skips without it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the scripts' sibling modules

import synth_gguf  # noqa: E402

pytestmark = pytest.mark.real_model
VOCAB = 151936
TOKENIZER_KEYS = {"tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                  "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id",
                  "tokenizer.ggml.bos_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.chat_template"}


def test_the_tiny_preset_has_the_geometry_and_mix_and_runs_in_ragpic(tmp_path, monkeypatch, capsys):
    import gguf
    import torch

    from ragpic.core.model import load_model
    from ragpic.models import MODELS

    source = synth_gguf.default_tokenizer()  # found before RAGPIC_HOME moves
    model = MODELS["qwen2.5-coder-0.5b"]
    if not (source.is_file() and source.stat().st_size == model.size):
        pytest.skip(f"needs the {model.name} GGUF's tokenizer at {source}: run `ragpic model get {model.name}`")
    monkeypatch.setenv("RAGPIC_HOME", str(tmp_path / "home"))
    assert synth_gguf.main(["--preset", "tiny", "--tokenizer-from", str(source), "--seed", "1"]) == 0
    path = tmp_path / "home" / "synth" / "tiny-q4_k_m-random.gguf"
    assert path.is_file() and not path.with_name(path.name + ".part").exists()
    assert "[26/26] blk.1.ffn_down.weight Q6_K" in capsys.readouterr().out
    stamp = path.stat().st_mtime_ns
    assert synth_gguf.main(["--preset", "tiny", "--tokenizer-from", str(source)]) == 0  # cached: not written again
    assert "not written again" in capsys.readouterr().out and path.stat().st_mtime_ns == stamp

    r = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    assert meta["general.architecture"] == "qwen2" and meta["general.file_type"] == 15  # MOSTLY_Q4_K_M
    assert (meta["qwen2.block_count"], meta["qwen2.embedding_length"], meta["qwen2.feed_forward_length"]) == (2, 256, 512)
    assert (meta["qwen2.attention.head_count"], meta["qwen2.attention.head_count_kv"]) == (4, 2)
    assert meta["qwen2.rope.freq_base"] == 1e6 and "<|im_start|>" in meta["tokenizer.chat_template"]
    assert {k for k in r.fields if k.startswith("tokenizer.")} == TOKENIZER_KEYS
    assert len(r.fields["tokenizer.ggml.tokens"].data) == VOCAB
    assert r.fields["tokenizer.ggml.model"].contents() == "gpt2"

    tensors = {t.name: t for t in r.tensors}
    kinds = {name: (t.tensor_type.name, [int(n) for n in t.shape]) for name, t in tensors.items()}  # shape: ggml order
    assert len(kinds) == 2 + 2 * 12 and "output.weight" not in kinds  # tiny is tied
    assert kinds["token_embd.weight"] == ("Q4_K", [256, VOCAB])
    assert kinds["output_norm.weight"] == ("F32", [256])
    for i, more in ((0, "Q4_K"), (1, "Q6_K")):  # llama.cpp's use_more_bits(i, 2): the last layer only
        assert kinds[f"blk.{i}.attn_q.weight"] == ("Q4_K", [256, 256])
        assert kinds[f"blk.{i}.attn_k.weight"] == ("Q4_K", [256, 128])
        assert kinds[f"blk.{i}.attn_v.weight"] == (more, [256, 128])
        assert kinds[f"blk.{i}.attn_output.weight"] == ("Q4_K", [256, 256])
        assert kinds[f"blk.{i}.ffn_gate.weight"] == kinds[f"blk.{i}.ffn_up.weight"] == ("Q4_K", [256, 512])
        assert kinds[f"blk.{i}.ffn_down.weight"] == (more, [512, 256])
        for bias, n in (("attn_q", 256), ("attn_k", 128), ("attn_v", 128)):
            assert kinds[f"blk.{i}.{bias}.bias"] == ("F32", [n])
        assert np.all(tensors[f"blk.{i}.attn_norm.weight"].data == 1)
    for name in ("blk.0.ffn_gate.weight", "blk.1.ffn_down.weight", "token_embd.weight"):
        t = tensors[name]
        w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        assert np.isfinite(w).all() and 0.01 < w.std() < 0.04 and abs(w.mean()) < 0.005, (name, w.std(), w.mean())
    del r, tensors

    lm = load_model(str(path), device="cpu", dtype="bfloat16", weights="gguf")
    cfg = lm.model.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == ("qwen2", 2, 256, VOCAB)
    assert lm.model.model.layers[0].self_attn.q_proj.bias is not None
    ids = lm.tokenizer("def add(a, b): return a + b", return_tensors="pt").input_ids[:, :5]
    assert ids.shape == (1, 5)
    with torch.no_grad():
        logits = lm.model(ids).logits
    assert logits.shape == (1, 5, VOCAB) and torch.isfinite(logits).all()
