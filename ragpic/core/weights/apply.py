"""Put a loaded model's weights into int8 or int4 (docs/ARCHITECTURE.md §4.8).

:func:`quantize_model` replaces every linear layer of the decoder and the output head with an
:class:`~ragpic.core.weights.linear.Int8Linear` or :class:`~ragpic.core.weights.linear.Int4Linear`
(int8 where the shape does not fit the int4 kernel's blocks) and the token embedding with an
:class:`~ragpic.core.weights.linear.Int8Embedding`; norms and biases stay in the compute dtype.
This is the path of a Hugging Face folder loaded with ``weights="int8"`` or ``"int4"``; a GGUF
file is converted a tensor at a time instead, its own 4-bit blocks kept
(:mod:`ragpic.core.weights.from_gguf`).
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass, field

import torch
from torch import nn

from ragpic.core.weights.formats import WeightFormat
from ragpic.core.weights.linear import Int4Linear, Int8Embedding, Int8Linear, quantize_int4, quantize_int8

__all__ = ["WeightReport", "quantize_model"]

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


@dataclass(slots=True)
class WeightReport:
    """What :func:`quantize_model` did.

    Attributes:
        format: the format applied.
        kinds: per layer kind (``int4``, ``int8``, ``int8 embedding``), how many tensors.
        weight_bytes: bytes of every weight and buffer the model holds now.
    """

    format: WeightFormat
    kinds: dict[str, int] = field(default_factory=dict)
    weight_bytes: int = 0

    def summary(self) -> str:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.kinds.items()))
        return f"weights {self.format}: {kinds}; {self.weight_bytes / 2**20:,.0f} MiB"


def _linear(lin: nn.Linear, fmt: WeightFormat, dtype: torch.dtype, kinds: collections.Counter) -> nn.Module:
    n, k = lin.weight.shape
    bias = None if lin.bias is None else lin.bias.detach()
    w = lin.weight.detach()
    if fmt is WeightFormat.INT4 and Int4Linear.fits(n, k):
        kinds["int4"] += 1
        return Int4Linear(*quantize_int4(w), bias, dtype)
    kinds["int8"] += 1
    return Int8Linear(*quantize_int8(w), bias, dtype)


def quantize_model(model: nn.Module, fmt: WeightFormat) -> WeightReport:
    """Replace ``model``'s linear layers, head and embedding in place; return what was done.

    Args:
        model: a transformers ``*ForCausalLM`` on the CPU, weights in its compute dtype.
        fmt: :attr:`WeightFormat.INT8` or :attr:`WeightFormat.INT4`, re-quantized from the model's weights.
    """
    if fmt not in (WeightFormat.INT8, WeightFormat.INT4):
        raise ValueError(f"quantize_model needs int8 or int4, got {fmt} (a GGUF file keeps its blocks through "
                         "ragpic.core.weights.from_gguf)")
    dtype = model.get_input_embeddings().weight.dtype
    kinds: collections.Counter = collections.Counter()
    targets = [(name, mod) for name, mod in model.named_modules()
               if isinstance(mod, nn.Linear) and (name == "lm_head" or _LAYER.match(name))]
    with torch.no_grad():
        for name, lin in targets:
            model.set_submodule(name, _linear(lin, fmt, dtype, kinds))
        emb = model.get_input_embeddings()
        kinds["int8 embedding"] += 1
        model.set_input_embeddings(Int8Embedding(*quantize_int8(emb.weight.detach()), dtype))
    held = {id(b): b.numel() * b.element_size() for b in (*model.parameters(), *model.buffers())}
    return WeightReport(fmt, dict(kinds), sum(held.values()))
