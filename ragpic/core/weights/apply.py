"""Put a loaded model's weights into a quantized :class:`WeightFormat` (docs/ARCHITECTURE.md §4.8).

:func:`quantize_model` replaces every linear layer of the decoder and the output head with an
:class:`~ragpic.core.weights.linear.Int8Linear` or :class:`~ragpic.core.weights.linear.Int4Linear`
and the token embedding with an :class:`~ragpic.core.weights.linear.Int8Embedding`; norms and
biases stay in the compute dtype. Under :attr:`WeightFormat.GGUF` each weight is read from the
GGUF file itself: 4-bit blocks become int4 layers unchanged (:mod:`ragpic.core.weights.gguf_blocks`),
any other type is dequantized in fp32 and re-quantized to int4 (int8 where the shape does not fit
the int4 kernel's blocks): the int4 kernel decodes ~2x faster than int8 at a teacher-forced KL
of ~0.01 nats against the fp32-dequantized model (docs/RESULTS.md §17). Every weight read from the file
is checked against the model's own (transformers' dequantized copy) before it replaces it, so a
wrong name or row order is refused rather than run.
"""

from __future__ import annotations

import collections
import os
import re
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from ragpic.core.weights.formats import WeightFormat
from ragpic.core.weights.gguf_blocks import EXACT_TYPES, int4_blocks
from ragpic.core.weights.linear import (Int4Embedding, Int4Linear, Int8Embedding, Int8Linear, quantize_int4,
                                        quantize_int8)
from ragpic.errors import UnsupportedModelError

__all__ = ["WeightReport", "quantize_model"]

# transformers' module names -> llama.cpp's tensor names (blk.<i>.<name>.weight)
_GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_TOLERANCE = 2e-2  # relative error a file's weight may show against transformers' copy (bf16 rounding)


@dataclass(slots=True)
class WeightReport:
    """What :func:`quantize_model` did.

    Attributes:
        format: the format applied.
        kinds: per layer kind (``int4 exact Q4_K``, ``int8 from Q5_0``, ``int8``...), how many tensors.
        weight_bytes: bytes of every weight and buffer the model holds now.
    """

    format: WeightFormat
    kinds: dict[str, int] = field(default_factory=dict)
    weight_bytes: int = 0

    def summary(self) -> str:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.kinds.items()))
        return f"weights {self.format}: {kinds}; {self.weight_bytes / 2**20:,.0f} MiB"


def _gguf_tensors(path: str | os.PathLike):
    from gguf import GGUFReader

    return {t.name: t for t in GGUFReader(str(path)).tensors}


def _gguf_name(module_name: str) -> str | None:
    if module_name == "lm_head":
        return "output.weight"
    if module_name == "model.embed_tokens":
        return "token_embd.weight"
    m = _LAYER.match(module_name)
    if m and m.group(2) in _GGUF_NAMES:
        return f"blk.{m.group(1)}.{_GGUF_NAMES[m.group(2)]}.weight"
    return None


def _llama_rows(n: int, heads: int) -> torch.Tensor:
    """Row ``j`` of a llama.cpp Q/K tensor is row ``index[j]`` of transformers'; the inverse order."""
    index = torch.arange(n).reshape(heads, 2, n // heads // 2).transpose(1, 2).reshape(n)
    return torch.argsort(index)


class _FileWeights:
    """The weights of a GGUF file by transformers module name, in transformers' row order."""

    def __init__(self, path, config):
        self.tensors = _gguf_tensors(path)
        self.arch = getattr(config, "model_type", "")
        self.heads = {"self_attn.q_proj": config.num_attention_heads,
                      "self_attn.k_proj": getattr(config, "num_key_value_heads", None) or config.num_attention_heads}

    def tensor(self, module_name: str):
        name = _gguf_name(module_name)
        if name is None and module_name == "lm_head":
            name = "token_embd.weight"
        return self.tensors.get(name) if name else None

    def rows(self, module_name: str, n: int) -> torch.Tensor | None:
        """The row order to apply (llama.cpp interleaves llama's Q/K rows per head), or None."""
        m = _LAYER.match(module_name)
        if self.arch in ("llama", "mistral") and m and m.group(2) in self.heads:
            return _llama_rows(n, self.heads[m.group(2)])
        return None

    def dense(self, t, rows: torch.Tensor | None) -> torch.Tensor:
        from gguf import dequantize

        w = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        # an f32 tensor comes back as the file's read-only map: torch would warn (and must not write it)
        w = torch.from_numpy(w if w.flags.writeable else w.copy())
        w = w.reshape(int(t.shape[1]), int(t.shape[0]))
        return w if rows is None else w[rows]


def _check(name: str, mine: torch.Tensor, theirs: torch.Tensor) -> None:
    err = (mine.float() - theirs.float()).norm() / theirs.float().norm().clamp_min(1e-12)
    if not err <= _TOLERANCE:
        raise UnsupportedModelError(f"{name}: the GGUF tensor does not match the model's weight (relative "
                                    f"error {float(err):.3g}); this file's layout is not one ragpic maps: "
                                    "load it with weights='dense'")


def _linear(name: str, lin: nn.Linear, fmt: WeightFormat, dtype: torch.dtype, file: _FileWeights | None,
            kinds: collections.Counter) -> nn.Module:
    n, k = lin.weight.shape
    bias = None if lin.bias is None else lin.bias.detach()
    t = file.tensor(name) if file is not None else None
    if t is not None:
        rows = file.rows(name, n)
        ggml = t.tensor_type.name
        if ggml in EXACT_TYPES and Int4Linear.fits(n, k):
            codes, scale, zero = int4_blocks(ggml, t.data, n, k)
            if rows is not None:
                codes, scale, zero = codes[rows], scale[:, rows], zero[:, rows]
            layer = Int4Linear(codes, scale, zero, bias, dtype)
            _check(name, layer.dense_weight(torch.float32), lin.weight)
            kinds[f"int4 exact {ggml}"] += 1
            return layer
        w = file.dense(t, rows)
        _check(name, w, lin.weight)
        if Int4Linear.fits(n, k):  # the 4-bit kernel decodes ~2x faster than int8 (docs/RESULTS.md §17)
            kinds[f"int4 from {ggml}"] += 1
            return Int4Linear(*quantize_int4(w), bias, dtype)
        kinds[f"int8 from {ggml}"] += 1
        return Int8Linear(*quantize_int8(w), bias, dtype)
    w = lin.weight.detach()
    if fmt is WeightFormat.INT4 and Int4Linear.fits(n, k):
        kinds["int4"] += 1
        return Int4Linear(*quantize_int4(w), bias, dtype)
    kinds["int8"] += 1
    return Int8Linear(*quantize_int8(w), bias, dtype)


def _embedding(emb: nn.Embedding, dtype: torch.dtype, file: _FileWeights | None,
               kinds: collections.Counter) -> nn.Module:
    t = file.tensor("model.embed_tokens") if file is not None else None
    if t is not None and t.tensor_type.name in EXACT_TYPES:
        rows, cols = emb.weight.shape
        layer = Int4Embedding(*int4_blocks(t.tensor_type.name, t.data, rows, cols), dtype)
        _check("token_embd.weight", layer(torch.arange(rows)).float(), emb.weight)
        kinds[f"int4 exact embedding {t.tensor_type.name}"] += 1
        return layer
    w = emb.weight.detach() if t is None else file.dense(t, None)
    if t is not None:
        _check("token_embd.weight", w, emb.weight)
    kinds["int8 embedding" if t is None else f"int8 embedding from {t.tensor_type.name}"] += 1
    return Int8Embedding(*quantize_int8(w), dtype)


def quantize_model(model: nn.Module, fmt: WeightFormat, *, gguf_path: str | os.PathLike | None = None) -> WeightReport:
    """Replace ``model``'s linear layers, head and embedding in place; return what was done.

    Args:
        model: a transformers ``*ForCausalLM`` on the CPU, weights in its compute dtype.
        fmt: :attr:`WeightFormat.INT8`, :attr:`WeightFormat.INT4` (re-quantized from the model's
            weights) or :attr:`WeightFormat.GGUF` (read from ``gguf_path``, the file the model was
            converted from).
    """
    if not fmt.quantized:
        raise ValueError(f"quantize_model needs int8, int4 or gguf, got {fmt}")
    if fmt is WeightFormat.GGUF and gguf_path is None:
        raise ValueError("weights='gguf' needs the GGUF file the model was loaded from")
    dtype = model.get_input_embeddings().weight.dtype
    file = _FileWeights(gguf_path, model.config) if fmt is WeightFormat.GGUF else None
    kinds: collections.Counter = collections.Counter()
    targets = [(name, mod) for name, mod in model.named_modules()
               if isinstance(mod, nn.Linear) and (name == "lm_head" or _LAYER.match(name))]
    with torch.no_grad():
        for name, lin in targets:
            model.set_submodule(name, _linear(name, lin, fmt, dtype, file, kinds))
        model.set_input_embeddings(_embedding(model.get_input_embeddings(), dtype, file, kinds))
    held = {id(b): b.numel() * b.element_size() for b in (*model.parameters(), *model.buffers())}
    return WeightReport(fmt, dict(kinds), sum(held.values()))
