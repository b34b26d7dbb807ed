"""Whose KV an entry is: a fingerprint of architecture, dtype, weights and tokenizer.

The fingerprint is part of every store key, so KV compiled by one model (or dtype, or
tokenizer) can never be linked into another's prompt.
"""

from __future__ import annotations

import hashlib
import json

import torch


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over every parameter's name, shape, dtype and a strided sample of its values.

    Cheap for any model size, yet two checkpoints (or two random inits) that differ anywhere
    in a sampled value get different digests.
    """
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        flat = p.detach().reshape(-1)
        step = max(1, flat.numel() // 4096)
        sample = flat[::step].to(device="cpu", dtype=torch.float32).contiguous()
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
        h.update(sample.numpy().tobytes())
    return h.hexdigest()


def tokenizer_digest(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    blob = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(blob.encode()).hexdigest()


def model_fingerprint(model: torch.nn.Module, tokenizer, weights: str = "dense") -> str:
    """``arch:dtype[+format]:weights[:16]:tokenizer[:16]`` — whose KV an entry is.

    ``weights``: the weight format (:class:`ragpic.core.weights.WeightFormat`); a quantized one
    is named after the dtype, so KV compiled under one format never links under another.
    """
    arch = getattr(model.config, "model_type", type(model).__name__)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    if str(weights) != "dense":
        dtype = f"{dtype}+{weights}"
    return f"{arch}:{dtype}:{weights_digest(model)[:16]}:{tokenizer_digest(tokenizer)[:16]}"


