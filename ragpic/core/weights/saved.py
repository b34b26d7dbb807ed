"""A converted model on disk: written a shard at a time, read back (docs/ARCHITECTURE.md §4.8).

A GGUF file is converted once (:mod:`ragpic.core.weights.from_gguf`) into a folder keyed by the
file's SHA-256, the format and the dtype: the tensors as safetensors shards (plain tensors, no
code), the config, the tokenizer and, for a quantized format, a JSON table of which module is
which layer kind. :class:`ShardWriter` flushes a shard as soon as it holds
:data:`SHARD_BYTES`, so converting never holds more than a shard and the tensor being made.
A dense folder is a Hugging Face checkpoint (``model.safetensors.index.json``) that
``from_pretrained`` reads; a quantized one is built on the meta device and filled from the
shards by :func:`load_saved`, a shard at a time, into the allocator's aligned memory: a few seconds.
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

__all__ = ["INDEX", "KINDS", "SHARD_BYTES", "ShardWriter", "kind_of", "load_saved", "saved_folder_ready", "staging",
           "write_table"]

KINDS = {"int8": Int8Linear, "int4": Int4Linear, "int8_embedding": Int8Embedding, "int4_embedding": Int4Embedding}
INDEX, _TABLE = "model.safetensors.index.json", "layers.json"
SHARD_BYTES = 64 << 20


def kind_of(module: nn.Module) -> str:
    """The table name of a quantized layer (a key of :data:`KINDS`)."""
    return {v: k for k, v in KINDS.items()}[type(module)]


class ShardWriter:
    """Tensors into ``model-NNNNN.safetensors`` shards under ``folder`` and the index that names them.

    Shards are flushed at :data:`SHARD_BYTES`; :meth:`close` writes the last one and the index.
    """

    def __init__(self, folder: Path, shard_bytes: int = SHARD_BYTES):
        self.folder, self.shard_bytes = folder, shard_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = self.total_bytes = 0
        self.weight_map: dict[str, str] = {}

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if name in self.weight_map or name in self.pending:
            raise ValueError(f"{name}: written twice")
        tensor = tensor.contiguous()
        self.pending[name] = tensor
        size = tensor.numel() * tensor.element_size()
        self.pending_bytes += size
        self.total_bytes += size
        if self.pending_bytes >= self.shard_bytes:
            self._flush()

    def _flush(self) -> None:
        from safetensors.torch import save_file

        if not self.pending:
            return
        shard = f"model-{len(set(self.weight_map.values())) + 1:05d}.safetensors"
        save_file(self.pending, str(self.folder / shard), metadata={"format": "pt"})
        self.weight_map.update(dict.fromkeys(self.pending, shard))
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> None:
        self._flush()
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": dict(sorted(self.weight_map.items()))}
        (self.folder / INDEX).write_text(json.dumps(index, indent=1))


class staging:
    """``with staging(target) as tmp:`` a folder beside ``target`` renamed onto it on success:
    a crash never leaves a half-written model, and of two processes writing at once the second's
    copy is dropped."""

    def __init__(self, target: Path):
        self.target = target

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(dir=self.target.parent, prefix=".convert-"))
        return self.tmp

    def __exit__(self, kind, error, tb) -> bool:
        if kind is None:
            try:
                os.replace(self.tmp, self.target)
                return False
            except OSError:
                if not saved_folder_ready(self.target):  # not another process winning the race
                    shutil.rmtree(self.tmp, ignore_errors=True)
                    raise
        shutil.rmtree(self.tmp, ignore_errors=True)
        return False


def saved_folder_ready(folder: Path) -> bool:
    """Whether ``folder`` holds a finished conversion (its index is written last, then it is renamed)."""
    return (folder / INDEX).is_file() and (folder / "config.json").is_file()


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


def write_table(folder: Path, layers: dict[str, str], summary: str) -> None:
    (folder / _TABLE).write_text(json.dumps({"layers": layers, "summary": summary}))


def load_saved(folder: Path, config, dtype: torch.dtype) -> tuple[nn.Module, str]:
    """The quantized model saved in ``folder``, on the CPU, and what converting it did."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, GenerationConfig

    meta = json.loads((folder / _TABLE).read_text())
    shards = sorted(set(json.loads((folder / INDEX).read_text())["weight_map"].values()))
    state: dict[str, torch.Tensor] = {}
    for shard in shards:  # .name: never a path outside the folder
        # Copied out of the file's map: a tensor there starts wherever the safetensors header put it
        # (8-byte aligned) on 4 KB file pages, and the int4 kernel reads such weights ~1.5x slower
        # than the allocator's 64-byte aligned memory (Qwen2.5-1.5B's gate_proj: 362 us against 237).
        # One shard (64 MB) at a time, so the copy adds a shard to the peak, not the model.
        state.update({k: t.clone() for k, t in load_file(str(folder / Path(shard).name)).items()})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    for name, kind in meta["layers"].items():
        prefix = name + "."
        mine = {k[len(prefix):]: state.pop(k) for k in [k for k in state if k.startswith(prefix)]}
        model.set_submodule(name, _restore(KINDS[kind], mine, dtype))
    model.load_state_dict(state, strict=False, assign=True)
    base = model.base_model
    base.rotary_emb = type(base.rotary_emb)(config=config)  # its inv_freq is not saved: computed on the CPU
    left = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if left:
        raise ValueError(f"{folder}: the saved weights miss {left[:3]}; delete the folder to convert again")
    try:
        model.generation_config = GenerationConfig.from_pretrained(folder)
    except OSError:
        pass
    model.eval()
    return model, meta["summary"]
