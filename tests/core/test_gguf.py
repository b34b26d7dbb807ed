"""A GGUF file as ``Config(model=...)``: converted exactly (weights="dense"), cached once by SHA-256, refused when
its architecture is not linkable or the file is cut short."""

from __future__ import annotations

import shutil

import pytest
import torch

import ragpic.core.gguf as gguf_mod
from ragpic import Config, RagPic
from ragpic.cli import main
from ragpic.core.gguf import GGUF_ARCHITECTURES, check_gguf, read_header
from ragpic.core.model import SUPPORTED_MODEL_TYPES, load_model
from ragpic.errors import ModelFileError, UnsupportedModelError
from tiny_gguf import write_tiny_gguf

PROMPT = "the quick brown fox jumps over the lazy dog. a needle hides in the haystack"


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A private ragpic cache, and a count of every GGUF conversion that runs."""
    monkeypatch.setenv("RAGPIC_HOME", str(tmp_path / "home"))
    calls = []
    real = gguf_mod.convert_gguf

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(gguf_mod, "convert_gguf", counting)
    return calls


def _logits(model, tokenizer):
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        return ids, model(ids).logits


# qwen2: QKV bias; llama: llama.cpp's Q/K row order; qwen3: q/k norms (at head_dim 128, the only
# one transformers' qwen3 GGUF reader derives: it ignores attention.key_length)
@pytest.mark.parametrize("kind,overrides", [("qwen2", {}), ("llama", {}), ("qwen3", {"head_dim": 128})])
def test_gguf_converts_to_the_same_model(tmp_path, home, kind, overrides):
    path = tmp_path / f"tiny-{kind}.gguf"
    src = write_tiny_gguf(path, kind, **overrides)
    assert read_header(path).architecture == kind
    lm = load_model(str(path), device="cpu", weights="dense")
    assert lm.model.config.model_type == kind
    assert lm.model.config.rope_parameters["rope_theta"] == 1e6
    ids, want = _logits(src.model, src.tokenizer)
    got_ids, got = _logits(lm.model, lm.tokenizer)
    assert torch.equal(ids, got_ids)  # the tokenizer came through the GGUF too
    assert (want - got).abs().max() <= 1e-5
    assert lm.tokenizer.chat_template == src.tokenizer.chat_template
    assert len(home) == 1


def test_every_gguf_architecture_is_one_ragpic_links_and_transformers_reads():
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    assert set(GGUF_ARCHITECTURES) <= set(SUPPORTED_MODEL_TYPES) & set(GGUF_SUPPORTED_ARCHITECTURES)


def test_config_gguf_is_cached_once_and_a_second_engine_reuses_it(tmp_path, home):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, "qwen2")
    first = RagPic(Config(model=str(path), device="cpu", weights="dense"))
    assert len(home) == 1
    folders = list((tmp_path / "home" / "models" / "gguf").glob("tiny-*-float32"))
    assert len(folders) == 1 and (folders[0] / "config.json").is_file()
    weights = next(folders[0].glob("*.safetensors"))
    stamp = weights.stat().st_mtime_ns
    second = RagPic(Config(model=str(path), device="cpu", weights="dense"))
    assert len(home) == 1 and weights.stat().st_mtime_ns == stamp  # no second conversion
    assert second.lm.fingerprint == first.lm.fingerprint
    # keyed by content: a copy elsewhere under the same name reuses the folder...
    (tmp_path / "copy").mkdir()
    shutil.copy(path, tmp_path / "copy" / "tiny.gguf")
    load_model(str(tmp_path / "copy" / "tiny.gguf"), device="cpu", weights="dense")
    assert len(home) == 1
    # ...another dtype is its own conversion, to that dtype
    lm = load_model(str(path), device="cpu", dtype="bfloat16", weights="dense")
    assert len(home) == 2 and lm.model.dtype == torch.bfloat16
    assert len(list((tmp_path / "home" / "models" / "gguf").glob("tiny-*-bfloat16"))) == 1


def test_a_gguf_transformers_would_load_partly_random_is_refused(tmp_path, home):
    path = tmp_path / "qwen3-hd16.gguf"
    write_tiny_gguf(path, "qwen3", head_dim=16)  # the reader would build head_dim 128 and re-init q/k/v/o
    with pytest.raises(UnsupportedModelError, match=r"q_proj.weight: the GGUF tensor is \(64, 64\).*needs \(512, 64\).*partly random"):
        load_model(str(path), device="cpu")
    assert not list((tmp_path / "home" / "models" / "gguf").glob("qwen3-hd16-*"))  # nothing cached


@pytest.mark.parametrize("arch", ["gpt2", "gemma"])
def test_unsupported_architecture_is_refused_before_converting(tmp_path, home, arch, capsys):
    path = tmp_path / f"{arch}.gguf"
    write_tiny_gguf(path, "llama", arch=arch)
    with pytest.raises(UnsupportedModelError, match=f"GGUF architecture '{arch}' is not supported.*llama, mistral"):
        load_model(str(path), device="cpu")
    with pytest.raises(UnsupportedModelError, match=f"model='{path}'"):
        RagPic(Config(model=str(path), device="cpu"))
    assert home == []
    assert main(["eval", "--model", str(path)]) == 2
    err = capsys.readouterr().err
    assert "--model" in err and f"'{arch}' is not supported" in err


def test_truncated_file_is_refused_naming_what_to_do(tmp_path, home, capsys):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, "qwen2")
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:-1000])  # the tensor data ends early
    with pytest.raises(ModelFileError, match=r"truncated: [\d,]+ bytes, its header needs [\d,]+; download or"):
        load_model(str(cut), device="cpu")
    cut.write_bytes(data[:2000])  # cut inside the metadata
    with pytest.raises(ModelFileError, match="header is cut short"):
        check_gguf(cut)
    cut.write_bytes(b"GGUF" + b"\0" * 2)
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        check_gguf(cut)
    assert home == []
    cut.write_bytes(data[:-1000])
    assert main(["bench", "--model", str(cut)]) == 2
    assert "truncated" in capsys.readouterr().err
    assert check_gguf(path).tensor_count > 0  # the whole file passes


def test_missing_gguf_is_a_usage_error(tmp_path, capsys):
    assert main(["eval", "--model", str(tmp_path / "nope.gguf")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_cli_model_option_takes_a_gguf_file(tmp_path, home, capsys):
    from tiny import TEXT

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, "qwen2")
    hay = tmp_path / "hay"
    hay.mkdir()
    (hay / "a.txt").write_text(TEXT * 4)
    out = tmp_path / "bench.json"
    assert main(["bench", "--haystack", str(hay), "--model", str(path), "--device", "cpu",
                 "--context-tokens", "64", "--chunk-tokens", "32", "--k", "2", "--query-tokens", "8",
                 "--repeats", "1", "--methods", "legolink", "--no-memory", "--json", str(out), "--quiet"]) == 0
    assert out.is_file() and "ttft_s" in capsys.readouterr().out
    assert len(home) == 1
