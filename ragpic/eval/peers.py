"""Reference prefills that ``ragpic bench`` can put beside its methods, on the same token ids.

- ``hf-generate``: what a user of plain transformers waits for the first token:
  ``model.generate(ids, max_new_tokens=1)`` with the model on transformers' own ``sdpa``
  attention (ragpic's attention function is switched off for the call, and back on after).
- ``llama.cpp``: llama-cpp-python's prefill (``Llama.eval``) of a GGUF file, when that package
  is installed (it builds from source, ~15 minutes on 2 cores; never a test dependency).

Each peer is a function ``ids -> seconds`` for one prefill of ``ids`` (a list of ints).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from ragpic.core.model import LoadedModel
from ragpic.errors import ConfigError
from ragpic.paths import DEFAULT_MODEL, default_gguf

__all__ = ["PEERS", "make_peer"]

PEERS = ("hf-generate", "llama.cpp")

Peer = Callable[[Sequence[int]], float]


def hf_generate(lm: LoadedModel) -> Peer:
    """Seconds of ``lm.model.generate(ids, max_new_tokens=1)`` on transformers' own SDPA."""
    model = lm.model

    @torch.inference_mode()
    def run(ids: Sequence[int]) -> float:
        x = torch.tensor([list(ids)], dtype=torch.long, device=lm.device)
        was = model.config._attn_implementation
        model.set_attn_implementation("sdpa")
        try:
            t0 = time.perf_counter()
            model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=1, do_sample=False,
                           pad_token_id=lm.tokenizer.eos_token_id)
            if lm.device.type == "cuda":
                torch.cuda.synchronize(lm.device)
            return time.perf_counter() - t0
        finally:
            model.set_attn_implementation(was)

    return run


def llamacpp(gguf: str, threads: int, n_ctx: int) -> Peer:
    """Seconds of llama.cpp's prefill of ``ids`` (flash attention on, ``threads`` threads)."""
    try:
        from llama_cpp import Llama
    except ImportError as exc:
        raise ConfigError("--peers llama.cpp needs llama-cpp-python (pip install llama-cpp-python; it builds "
                          "from source) and --gguf PATH") from exc
    llm = Llama(model_path=gguf, n_ctx=n_ctx, n_batch=512, n_threads=threads, flash_attn=True, verbose=False)

    def run(ids: Sequence[int]) -> float:
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(list(ids))
        return time.perf_counter() - t0

    return run


def make_peer(name: str, lm: LoadedModel, *, gguf: str | None = None, n_ctx: int = 8192) -> Peer:
    """The peer called ``name`` (one of :data:`PEERS`); llama.cpp reads ``gguf`` (default: the
    embedded model's own GGUF, when ``lm`` is the embedded model)."""
    if name == "hf-generate":
        return hf_generate(lm)
    if name == "llama.cpp":
        if gguf is None and lm.name == DEFAULT_MODEL:
            gguf = str(default_gguf() or "")
        if not gguf:
            raise ConfigError("--peers llama.cpp needs --gguf PATH: the GGUF file of the benchmarked model")
        return llamacpp(gguf, torch.get_num_threads(), n_ctx)
    raise ConfigError(f"unknown peer {name!r}: choose from {', '.join(PEERS)}")
