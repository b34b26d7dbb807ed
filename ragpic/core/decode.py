"""Decode from a linked cache: token ids until EOS or the length limit.

:class:`Decoder` holds one request's state (sampling, EOS, per-token buffers made once:
:class:`DecodeBuffers`) and is the one token loop: :func:`decode_tokens` drives it alone, the
engine's request (:class:`ragpic.engine.request.LinkedRequest`) one step at a time or in a
batch. Ids become text in :mod:`ragpic.engine.detok`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ragpic.checks import check_int, check_number, check_stop
from ragpic.core.runner import runner_for
from ragpic.core.model import LoadedModel
from ragpic.core.ops.linked_cache import LinkedCache

__all__ = ["DecodeBuffers", "Decoder", "Sampling", "decode_tokens", "eos_token_ids", "next_token", "pick_token"]


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


class Decoder:
    """One request's decoding state over its linked cache: the one token loop every path runs.

    :meth:`pick` chooses the next id from ``(V,)`` fp32 logits (None: EOS, nothing emitted);
    :meth:`forward` feeds the last picked id at its position and returns the next logits. A
    batched step (:meth:`ragpic.core.runner.ModelRunner.decode` of several requests) feeds ``token`` at ``pos``
    itself and hands each row's logits to :meth:`pick`.

    Attributes:
        count: ids picked so far (EOS not counted).
        token: the last id picked (-1 before the first).
        bufs: the per-token buffers (:class:`DecodeBuffers`), made once.
    """

    def __init__(self, lm: LoadedModel, cache: LinkedCache, prompt_len: int, sampling: Sampling):
        self.lm, self.cache, self.sampling = lm, cache, sampling
        self.gen = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
        self.eos = frozenset(eos_token_ids(lm))
        self.bufs = DecodeBuffers(lm, prompt_len, sampling.max_new_tokens)
        self.count = 0
        self.token = -1
        self._fed: torch.Tensor | int = -1

    @property
    def pos(self) -> int:
        """Position of the last picked id (where :meth:`forward` writes its KV)."""
        return self.bufs.prompt_len + self.count - 1

    @property
    def exhausted(self) -> bool:
        """``max_new_tokens`` ids picked: no forward should follow."""
        return self.count >= self.sampling.max_new_tokens

    def pick(self, logits: torch.Tensor) -> int | None:
        """The next id from ``(V,)`` fp32 logits, or None on EOS."""
        tok, fed = next_token(logits, self.sampling, self.gen)
        if tok in self.eos:
            return None
        self.token, self._fed, self.count = tok, fed, self.count + 1
        return tok

    @torch.inference_mode()
    def forward(self) -> torch.Tensor:
        """``(V,)`` fp32 logits after feeding the last picked id at :attr:`pos`."""
        return self.bufs.forward(self.lm, self.cache, self.count - 1, self._fed)


@torch.inference_mode()
def decode_tokens(lm: LoadedModel, cache: LinkedCache, first_logits: torch.Tensor, prompt_len: int,
                  sampling: Sampling) -> Iterator[int]:
    """Yield generated ids until EOS or ``max_new_tokens``; the cache grows in place.

    A :class:`Decoder` driven to the end: the first id comes from the link's logits (no extra
    forward); each later id costs one single-token forward at position ``prompt_len + i``, on
    buffers made once (:class:`DecodeBuffers`). Greedy ids are fed back on the device and read
    by the host once each, to be yielded.
    """
    dec = Decoder(lm, cache, prompt_len, sampling)
    logits = first_logits
    while (tok := dec.pick(logits)) is not None:
        yield tok
        if dec.exhausted:
            return
        logits = dec.forward()


def next_token(logits: torch.Tensor, sampling: Sampling,
               generator: torch.Generator | None) -> tuple[int, torch.Tensor | int]:
    """``(host id, what to feed back)`` from ``(V,)`` fp32 logits: greedy feeds back the
    ``(1,)`` device argmax (read once by the host); sampling picks on the host."""
    if sampling.temperature == 0:
        top = logits.argmax().reshape(1)
        return int(top), top  # the step's one device-to-host read
    tok = pick_token(logits, sampling, generator)
    return tok, tok


def eos_token_ids(lm: LoadedModel) -> tuple[int, ...]:
    """The ids that end a generation: the model's generation config's EOS, else the tokenizer's.

    Read at each call, not when the model was wrapped: a caller may change the generation
    config afterwards (tests switch EOS off to get a fixed number of tokens).
    """
    config = lm.model.generation_config
    ids = config.eos_token_id if config else None
    if ids is None:
        ids = lm.tokenizer.eos_token_id
    if ids is None:
        return ()
    return tuple(ids) if isinstance(ids, (list, tuple)) else (int(ids),)


# ----------------------------------------------------------------------------- per-token buffers
# A decode step is a one-row forward, so its fixed costs dominate on a GPU: building small
# tensors from Python values (a blocking host-to-device copy each), a fresh mask, bands.
# DecodeBuffers makes them once per generation: every position on the device, one additive
# mask row whose growing prefix is each step's mask, and one id slot for sampled tokens.
# Greedy tokens never leave the device to be fed back; the host reads each one once, to yield
# it (the one sync a streamed token needs).
_ALIGN = 16  # mask rows padded to 16 elements: fused SDPA kernels want aligned mask strides


class DecodeBuffers:
    """Positions, mask and an id slot for decoding up to ``steps`` tokens after ``prompt_len``.

    Attributes:
        positions: ``(steps,)`` int64 on the device: ``prompt_len + i`` for step ``i``.
        mask: ``(1, 1, 1, W)`` additive mask row in the model dtype, ``W >= prompt_len + steps``;
            step ``i`` uses its first ``prompt_len + i + 1`` columns. Zeros, except keys a
            sliding window has left behind, masked as the window moves (one small fill a step).
        ids: ``(1,)`` int64 slot for a token chosen on the host (sampling).
    """

    def __init__(self, lm: LoadedModel, prompt_len: int, steps: int):
        dev = lm.device
        self.prompt_len = prompt_len
        self.window = lm.sliding_window
        self.positions = torch.arange(prompt_len, prompt_len + steps, device=dev)
        width = -(-(prompt_len + steps) // _ALIGN) * _ALIGN
        self.mask = torch.zeros((1, 1, 1, width), dtype=lm.dtype, device=dev)
        self._masked_upto = 0  # keys [0, _masked_upto) are masked already
        self._min = torch.finfo(lm.dtype).min
        self.ids = torch.zeros(1, dtype=torch.long, device=dev)

    def step_mask(self, i: int) -> torch.Tensor:
        """``(1, 1, 1, prompt_len + i + 1)`` mask for the token at position ``prompt_len + i``."""
        p = self.prompt_len + i
        if self.window is not None and p - self.window + 1 > self._masked_upto:
            self.mask[..., self._masked_upto:p - self.window + 1] = self._min  # keys t <= p - window
            self._masked_upto = p - self.window + 1
        return self.mask[..., :p + 1]

    def forward(self, lm: LoadedModel, cache: LinkedCache, i: int, token: torch.Tensor | int) -> torch.Tensor:
        """``(V,)`` fp32 logits after feeding ``token`` (a ``(1,)`` device tensor, or a host
        int written into the id slot) at position ``prompt_len + i``."""
        if not isinstance(token, torch.Tensor):
            self.ids.fill_(token)  # a scalar kernel argument: no host-to-device copy
            token = self.ids
        p = self.prompt_len + i
        runner = runner_for(lm)
        mask = None if runner.lean else self.step_mask(i)  # the lean step needs no mask
        return runner.decode(token, (p,), (cache,), device_positions=self.positions[i:i + 1], mask=mask)[0]
