"""Decode from a linked cache: greedy or sampled token ids until EOS or the length limit."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ragpic.checks import check_int, check_number, check_stop
from ragpic.core.decode_step import DecodeBuffers
from ragpic.core.model import LoadedModel
from ragpic.core.ops.linked_cache import LinkedCache

__all__ = ["Sampling", "decode_tokens", "next_token", "pick_token"]


@dataclass(slots=True, frozen=True)
class Sampling:
    """Decoding settings. ``temperature == 0`` is greedy (argmax)."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        # frozen: normalise through object.__setattr__ (a single stop str is one stop string)
        object.__setattr__(self, "stop", check_stop(self.stop))
        check_int("max_new_tokens", self.max_new_tokens, minimum=1)
        check_number("temperature", self.temperature, "a number >= 0 (0 is greedy)", lambda v: v >= 0)
        check_number("top_p", self.top_p, "a number in (0, 1]", lambda v: 0 < v <= 1)
        check_int("top_k", self.top_k, minimum=0)
        if self.seed is not None:
            check_int("seed", self.seed, minimum=0)


def pick_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """Next token id from ``(V,)`` fp32 logits."""
    if sampling.temperature == 0:
        return int(logits.argmax())
    logits = logits / sampling.temperature
    if sampling.top_k:
        kth = torch.topk(logits, min(sampling.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sampling.top_p < 1:
        sorted_p, order = probs.sort(descending=True)
        drop = sorted_p.cumsum(0) - sorted_p > sampling.top_p  # keep the smallest set reaching top_p
        sorted_p[drop] = 0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


@torch.inference_mode()
def decode_tokens(lm: LoadedModel, cache: LinkedCache, first_logits: torch.Tensor, prompt_len: int,
                  sampling: Sampling) -> Iterator[int]:
    """Yield generated ids until EOS or ``max_new_tokens``; the cache grows in place.

    The first id comes from the link's logits (no extra forward); each later id costs one
    single-token forward at position ``prompt_len + i``, on buffers made once
    (:class:`~ragpic.core.decode_step.DecodeBuffers`). Greedy ids are fed back on the device
    and read by the host once each, to be yielded.
    """
    gen = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
    eos = set(lm.eos_token_ids)
    bufs = DecodeBuffers(lm, prompt_len, sampling.max_new_tokens)
    logits = first_logits
    for i in range(sampling.max_new_tokens):
        tok, fed = next_token(logits, sampling, gen)
        if tok in eos:
            return
        yield tok
        if i + 1 == sampling.max_new_tokens:
            return
        logits = bufs.forward(lm, cache, i, fed)


def next_token(logits: torch.Tensor, sampling: Sampling,
               generator: torch.Generator | None) -> tuple[int, torch.Tensor | int]:
    """``(host id, what to feed back)`` from ``(V,)`` fp32 logits: greedy feeds back the
    ``(1,)`` device argmax (read once by the host); sampling picks on the host."""
    if sampling.temperature == 0:
        top = logits.argmax().reshape(1)
        return int(top), top  # the step's one device-to-host read
    tok = pick_token(logits, sampling, generator)
    return tok, tok
