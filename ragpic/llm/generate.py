"""Decode from a linked cache: greedy or sampled, EOS, stop strings, streaming."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from .linked_cache import LinkedCache, additive_mask, forward_with_cache
from .model import LoadedModel


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
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError("need temperature >= 0, 0 < top_p <= 1 and top_k >= 0")


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
    single-token forward at position ``prompt_len + i``.
    """
    gen = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
    eos = set(lm.eos_token_ids)
    logits = first_logits
    for i in range(sampling.max_new_tokens):
        tok = pick_token(logits, sampling, gen)
        if tok in eos:
            return
        yield tok
        if i + 1 == sampling.max_new_tokens:
            return
        pos = torch.tensor([prompt_len + i], device=lm.device)
        cache.prepare(pos, prompt_len + i + 1)
        mask = additive_mask(pos, prompt_len + i + 1, dtype=lm.dtype, sliding_window=lm.sliding_window)
        out = forward_with_cache(lm.model, torch.tensor([[tok]], device=lm.device), pos[None], cache, mask,
                                 bands=lm.bands(pos))
        logits = out.logits[0, -1].float()


def _stop_hit(text: str, stops: Sequence[str]) -> int:
    """Index where the earliest stop string starts in ``text``, or -1."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else -1


def _held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing chars might be the start of a stop string (not safe to emit yet)."""
    hold = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:n]):
                hold = max(hold, n)
                break
    return hold


@dataclass(slots=True)
class TextDelta:
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length" or "eos" on the last delta


def stream_text(lm: LoadedModel, token_iter: Iterator[int], sampling: Sampling) -> Iterator[TextDelta]:
    """Turn ids into text deltas, honouring stop strings without emitting any part of them.

    The whole generated id list is decoded each step (not token by token) so multi-byte
    characters and merges come out right; only the new suffix is emitted.
    """
    ids: list[int] = []
    emitted = 0
    for tok in token_iter:
        ids.append(tok)
        text = lm.tokenizer.decode(ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next byte
            continue
        cut = _stop_hit(text, sampling.stop)
        if cut >= 0:
            yield TextDelta(text[emitted:cut], ids.copy(), "stop")
            return
        safe = len(text) - _held_back(text, sampling.stop)
        if safe > emitted:
            yield TextDelta(text[emitted:safe], ids.copy())
            emitted = safe
    text = lm.tokenizer.decode(ids, skip_special_tokens=True)
    reason = "length" if len(ids) >= sampling.max_new_tokens else "eos"
    yield TextDelta(text[emitted:], ids.copy(), reason)
