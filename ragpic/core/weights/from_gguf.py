"""A GGUF file into a saved model one tensor at a time: the whole model never exists dense
(docs/ARCHITECTURE.md §4.8).

Each tensor is read with a plain file read (the pages of a memory map, once touched, count
toward the process's memory until the map closes), turned into its runtime form and handed to
a :class:`~ragpic.core.weights.saved.ShardWriter` before the next is read; a large tensor goes
a slice of rows at a time (:data:`SLICE_BYTES` of fp32 at most). The runtime forms:

- ``dense``: every tensor dequantized to fp32 by the ``gguf`` package (as transformers' GGUF
  reader does), then cast to the dtype: a Hugging Face checkpoint, bit for bit what
  ``from_pretrained(gguf_file=...)`` builds;
- ``gguf``: Q4_0/Q4_1/Q4_K linear weights kept as int4 codes exactly
  (:mod:`ragpic.core.weights.gguf_blocks`), any other type dequantized and re-quantized to int4
  (int8 where the shape does not fit the int4 kernel), the embedding kept or made int8;
- ``int8``/``int4``: every linear re-quantized from its dequantized weight in the dtype.

Norms and biases stay in the dtype. llama.cpp stores llama's (and mistral's) Q/K rows
interleaved per head; they are put back in transformers' order. Every tensor is checked
against the shape the config gives, and every weight the model needs must be found.
"""

from __future__ import annotations

import collections
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ragpic.core.weights.formats import WeightFormat
from ragpic.core.weights.gguf_blocks import EXACT_TYPES, int4_blocks
from ragpic.core.weights.linear import (Int4Embedding, Int4Linear, Int8Embedding, Int8Linear, quantize_int4,
                                        quantize_int8)
from ragpic.core.weights.saved import ShardWriter, kind_of, staging, write_table
from ragpic.errors import UnsupportedModelError

__all__ = ["SLICE_BYTES", "GGUFTensors", "write_converted"]

SLICE_BYTES = 64 << 20
_SHOW_PROGRESS_FROM = 256 << 20
# llama.cpp's names -> transformers' (blk.<i>.<name> -> model.layers.<i>.<name>)
_LINEAR = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
           "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
           "ffn_down": "mlp.down_proj"}
_OTHER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
          "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_SKIPPED = ("rope_freqs.weight",)  # llama3's frequencies: transformers computes them from the config
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


@dataclass(frozen=True, slots=True)
class _Tensor:
    """Where one tensor lies in the file: ``rows`` x ``cols`` (a 1-D tensor is one row)."""

    name: str
    qtype: object  # gguf.GGMLQuantizationType
    rows: int
    cols: int
    offset: int
    row_bytes: int

    @property
    def ggml(self) -> str:
        return self.qtype.name


class GGUFTensors:
    """A GGUF file's tensors by name, read a slice of rows at a time (a context manager)."""

    def __init__(self, path: str | os.PathLike):
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        from ragpic.core.gguf_header import read_header

        self.tensors: dict[str, _Tensor] = {}
        for t in read_header(path).tensors:  # the table only: no tensor data is read
            qtype = GGMLQuantizationType(t.ggml_type)
            block, size = GGML_QUANT_SIZES[qtype]
            self.tensors[t.name] = _Tensor(t.name, qtype, int(np.prod(t.dims[1:], dtype=np.int64)), t.dims[0],
                                           t.offset, t.dims[0] // block * size)
        self.size = Path(path).stat().st_size
        self._fd = os.open(path, os.O_RDONLY)

    def __enter__(self) -> GGUFTensors:
        return self

    def __exit__(self, *exc) -> None:
        os.close(self._fd)

    def raw(self, t: _Tensor, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of ``t`` as ``(stop - start, row_bytes)`` uint8, read from the file."""
        buf = bytearray((stop - start) * t.row_bytes)
        if os.preadv(self._fd, [buf], t.offset + start * t.row_bytes) != len(buf):
            raise UnsupportedModelError(f"{t.name}: the file ends inside this tensor; download it again")
        return np.frombuffer(buf, dtype=np.uint8).reshape(stop - start, t.row_bytes)

    def slices(self, t: _Tensor) -> list[tuple[int, int]]:
        """Row ranges of at most :data:`SLICE_BYTES` of fp32, in whole 64-row blocks."""
        step = max(64, SLICE_BYTES // (4 * t.cols) // 64 * 64)
        return [(i, min(i + step, t.rows)) for i in range(0, t.rows, step)]

    def dense(self, t: _Tensor, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` dequantized: ``(stop - start, cols)`` fp32."""
        from gguf import dequantize

        w = dequantize(self.raw(t, start, stop), t.qtype)
        return torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)).reshape(stop - start, t.cols)


def _llama_rows(n: int, heads: int) -> torch.Tensor:
    """Row ``j`` of a llama.cpp Q/K tensor is row ``index[j]`` of transformers'; the inverse order."""
    index = torch.arange(n).reshape(heads, 2, n // heads // 2).transpose(1, 2).reshape(n)
    return torch.argsort(index)


class _Converter:
    """The conversion of one file to one format: its tensors in order, their runtime forms."""

    def __init__(self, file: GGUFTensors, config, fmt: WeightFormat, dtype: torch.dtype, writer: ShardWriter):
        from transformers import AutoModelForCausalLM

        self.file, self.fmt, self.dtype, self.writer = file, fmt, dtype, writer
        with torch.device("meta"):
            meta = AutoModelForCausalLM.from_config(config)
        self.shapes = {k: tuple(v.shape) for k, v in meta.state_dict().items()}
        self.tied = bool(getattr(config, "tie_word_embeddings", False))
        heads = config.num_attention_heads
        self.heads = {"attn_q": heads, "attn_k": getattr(config, "num_key_value_heads", None) or heads} \
            if config.model_type in ("llama", "mistral") else {}
        self.layers: dict[str, str] = {}
        self.kinds: collections.Counter = collections.Counter()
        self.written: set[str] = set()

    def hf_name(self, name: str) -> tuple[str, str, str]:
        """``(module, part, llama.cpp kind)`` of a GGUF tensor name, or an error naming it."""
        if m := _BLOCK.match(name):
            layer, kind, part = m.groups()
            if kind in _LINEAR or kind in _OTHER:
                return f"model.layers.{layer}.{_LINEAR.get(kind) or _OTHER[kind]}", part, kind
        top, _, part = name.rpartition(".")
        if top in _TOP and part in ("weight", "bias"):
            return _TOP[top], part, top
        raise UnsupportedModelError(f"{name}: a GGUF tensor ragpic does not map to the model; "
                                    "convert the file to a Hugging Face folder instead")

    def expect(self, key: str, shape: tuple[int, ...]) -> None:
        want = self.shapes.get(key)
        if want != shape:
            raise UnsupportedModelError(
                f"{key}: the GGUF tensor is {shape}, the model built from the file's header needs {want} (the config "
                "transformers derives from the header does not fit the tensors, e.g. a qwen3 file whose head_dim is "
                "not 128); refused rather than run partly random: convert it to a Hugging Face folder instead")

    def read(self, t: _Tensor, kind: str) -> torch.Tensor:
        """The whole tensor dequantized, in transformers' row order, in the dtype."""
        w = torch.cat([self.file.dense(t, a, b).to(self.dtype) for a, b in self.file.slices(t)])
        w = w if t.rows > 1 else w.reshape(t.cols)
        if kind in self.heads:  # llama.cpp's Q/K order: a weight's rows, or its bias's entries alike
            w = w[_llama_rows(w.shape[0], self.heads[kind])]
        return w

    def put(self, key: str, tensor: torch.Tensor) -> None:
        self.writer.add(key, tensor)
        self.written.add(key)

    def plain(self, t: _Tensor, module: str, part: str, kind: str) -> None:
        key = f"{module}.{part}"
        w = self.read(t, kind)
        self.expect(key, tuple(w.shape))
        self.put(key, w)

    def quantized(self, t: _Tensor, kind: str) -> tuple[torch.Tensor, ...]:
        """Int4 ``(codes, scales, zeros)`` or int8 ``(codes, scales)`` of a 2-D tensor, and its kind."""
        n, k = t.rows, t.cols
        rows = _llama_rows(n, self.heads[kind]) if kind in self.heads else None
        exact = self.fmt is WeightFormat.GGUF and t.ggml in EXACT_TYPES
        int4 = Int4Linear.fits(n, k) and self.fmt is not WeightFormat.INT8
        parts = []
        for a, b in self.file.slices(t):
            if exact and int4:
                parts.append(int4_blocks(t.ggml, self.file.raw(t, a, b), b - a, k))
                continue
            w = self.file.dense(t, a, b)
            if self.fmt is not WeightFormat.GGUF:  # re-quantized from the model in its dtype, as a folder's
                w = w.to(self.dtype)
            parts.append(quantize_int4(w) if int4 else quantize_int8(w))
        if int4:  # codes (N, K) on rows; scales, zeros (K/32, N) on columns
            out = (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts], 1),
                   torch.cat([p[2] for p in parts], 1))
            out = out if rows is None else (out[0][rows], out[1][:, rows], out[2][:, rows])
        else:
            out = (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
            out = out if rows is None else (out[0][rows], out[1][rows])
        source = f" from {t.ggml}" if self.fmt is WeightFormat.GGUF else ""
        label = ("int4 exact " + t.ggml) if exact and int4 else ("int4" if int4 else "int8") + source
        return out, label

    def add_layer(self, module: str, layer: nn.Module, label: str) -> None:
        for part, tensor in layer.state_dict().items():
            self.put(f"{module}.{part}", tensor)
        self.layers[module] = kind_of(layer)
        self.kinds[label] += 1

    def linear(self, t: _Tensor, module: str, kind: str, bias: _Tensor | None) -> None:
        self.expect(f"{module}.weight", (t.rows, t.cols))
        b = None
        if bias is not None:
            b = self.read(bias, kind)
            self.expect(f"{module}.bias", tuple(b.shape))
        out, label = self.quantized(t, kind)
        layer = Int4Linear(*out, b, self.dtype) if len(out) == 3 else Int8Linear(*out, b, self.dtype)
        self.add_layer(module, layer, label)

    def embedding(self, t: _Tensor) -> None:
        self.expect("model.embed_tokens.weight", (t.rows, t.cols))
        if self.fmt is WeightFormat.GGUF and t.ggml in EXACT_TYPES:
            parts = [int4_blocks(t.ggml, self.file.raw(t, a, b), b - a, t.cols) for a, b in self.file.slices(t)]
            layer = Int4Embedding(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts], 1),
                                  torch.cat([p[2] for p in parts], 1), self.dtype)
            return self.add_layer("model.embed_tokens", layer, f"int4 exact embedding {t.ggml}")
        parts = []
        for a, b in self.file.slices(t):
            w = self.file.dense(t, a, b)
            parts.append(quantize_int8(w if self.fmt is WeightFormat.GGUF else w.to(self.dtype)))
        layer = Int8Embedding(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]), self.dtype)
        source = f" from {t.ggml}" if self.fmt is WeightFormat.GGUF else ""
        self.add_layer("model.embed_tokens", layer, "int8 embedding" + source)

    def run(self, progress) -> None:
        tensors = self.file.tensors
        for t in progress(list(tensors.values())):
            if t.name in _SKIPPED:
                continue
            module, part, kind = self.hf_name(t.name)
            if not self.fmt.quantized or (part == "bias" and kind not in _LINEAR) or kind in _OTHER \
                    or kind == "output_norm":
                self.plain(t, module, part, kind)
            elif part == "bias":
                continue  # written with its weight
            elif kind == "token_embd":
                self.embedding(t)
                if self.tied:  # the head reads the embedding's weights (as transformers ties them)
                    self.linear(t, "lm_head", "output", None)
            else:
                self.linear(t, module, kind, tensors.get(t.name.removesuffix("weight") + "bias"))
        missing = sorted(k for k in self.shapes if k not in self.written and not self._covered(k))
        if missing:
            raise UnsupportedModelError(f"the GGUF file has no tensor for {missing[:3]}: transformers' config from its "
                                        "header does not fit it; convert it to a Hugging Face folder instead")

    def _covered(self, key: str) -> bool:
        """Whether a model key needs no tensor of its own: a tied head, or a quantized layer's weight."""
        module = key.rpartition(".")[0]
        if key == "lm_head.weight" and self.tied and not self.fmt.quantized:
            return True
        return module in self.layers

    def summary(self) -> str:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.kinds.items()))
        return f"weights {self.fmt}: {kinds}; {self.writer.total_bytes / 2**20:,.0f} MiB"


def write_converted(path: str | os.PathLike, target: Path, config, tokenizer, fmt: WeightFormat,
                    dtype: torch.dtype) -> Path:
    """Convert the GGUF at ``path`` to ``fmt`` in ``dtype`` and save it as the folder ``target``.

    Args:
        config: the transformers config of the file (``AutoConfig.from_pretrained(..., gguf_file=...)``).
        tokenizer: its tokenizer, saved beside the weights.
        fmt: ``dense``, ``gguf``, ``int8`` or ``int4`` (never ``auto``).

    Raises:
        UnsupportedModelError: a tensor that maps to no weight of the model, or a shape that differs.
    """
    from tqdm import tqdm
    from transformers import GenerationConfig

    config.dtype = dtype
    with staging(Path(target)) as tmp, GGUFTensors(path) as file:
        writer = ShardWriter(tmp)
        conv = _Converter(file, config, fmt, dtype, writer)

        def progress(items):
            return tqdm(items, desc=f"ragpic: converting {Path(path).name}", unit="tensor", file=sys.stderr,
                        disable=file.size < _SHOW_PROGRESS_FROM)

        conv.run(progress)
        writer.close()
        config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        GenerationConfig.from_model_config(config).save_pretrained(tmp)
        if fmt.quantized:
            write_table(tmp, conv.layers, conv.summary())
    return Path(target)
