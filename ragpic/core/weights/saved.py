"""A quantized model saved once and mapped back (docs/ARCHITECTURE.md §4.8).

Quantizing a GGUF's 0.5B takes ~45 s (reading, checking and packing every tensor) and leaves
the heap holding the dense copy it came from. So the first load saves the result beside the
dense folder, keyed like it by the file's SHA-256 plus the format and dtype: the buffers as
safetensors (plain tensors, no code) and a JSON table of which module is which layer kind.
Later loads build the model on the meta device, put the layers back from that table and map
the tensors from the file: a few seconds, and the weights are the file's pages.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

from ragpic.core.weights.linear import Int4Embedding, Int4Linear, Int8Embedding, Int8Linear

__all__ = ["load_saved", "save_quantized"]

_KINDS = {"int8": Int8Linear, "int4": Int4Linear, "int8_embedding": Int8Embedding, "int4_embedding": Int4Embedding}
_FILE, _TABLE = "weights.safetensors", "layers.json"


def _restore(cls: type[nn.Module], tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> nn.Module:
    """A quantized layer around saved buffers, without re-packing them."""
    layer = cls.__new__(cls)
    nn.Module.__init__(layer)
    for name, t in tensors.items():
        layer.register_buffer(name, t)
    if "bias" not in tensors and cls in (Int8Linear, Int4Linear):
        layer.register_buffer("bias", None)
    if cls in (Int8Embedding, Int4Embedding):
        layer.num_embeddings, layer.embedding_dim = tensors["codes"].shape
        layer.dtype = dtype
    else:
        first = tensors["codes"] if cls is Int8Linear else tensors["packed"]
        layer.out_features = first.shape[0]
        layer.in_features = first.shape[1] * (1 if cls is Int8Linear else 2)
    return layer


def save_quantized(model: nn.Module, target: Path, summary: str) -> None:
    """Write ``model``'s state and layer table to ``target`` (atomically: beside it, then renamed)."""
    from safetensors.torch import save_file

    kinds = {v: k for k, v in _KINDS.items()}
    table = {name: kinds[type(m)] for name, m in model.named_modules() if type(m) in kinds}
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".quantize-"))
    try:
        save_file(state, str(tmp / _FILE))
        (tmp / _TABLE).write_text(json.dumps({"layers": table, "summary": summary}))
        os.replace(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / _TABLE).exists():  # not another process winning the race
            raise


def load_saved(target: Path, config, dtype: torch.dtype) -> tuple[nn.Module, str] | None:
    """The model saved at ``target`` on the CPU and its summary, or None when there is none."""
    if not (target / _TABLE).exists():
        return None
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, GenerationConfig

    meta = json.loads((target / _TABLE).read_text())
    state = load_file(str(target / _FILE))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    for name, kind in meta["layers"].items():
        prefix = name + "."
        mine = {k[len(prefix):]: state.pop(k) for k in [k for k in state if k.startswith(prefix)]}
        model.set_submodule(name, _restore(_KINDS[kind], mine, dtype))
    model.load_state_dict(state, strict=False, assign=True)
    base = model.base_model
    base.rotary_emb = type(base.rotary_emb)(config=config)  # its inv_freq is not saved: computed on the CPU
    left = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if left:
        raise ValueError(f"{target}: the saved weights miss {left[:3]}; delete the folder to quantize again")
    try:
        model.generation_config = GenerationConfig.from_pretrained(config._name_or_path)
    except OSError:
        pass
    model.eval()
    return model, meta["summary"]
