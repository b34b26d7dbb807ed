"""The model runner: the one place ragpic calls a loaded model's modules (docs/ARCHITECTURE.md §4.2).

A :class:`ModelRunner` is made once per :class:`~ragpic.core.model.LoadedModel`
(:func:`runner_for`) and calls its parts, looked up on the model at each call (quantizing a
model replaces them): the embedding, the rotary embedding, the decoder layers, the final norm
and the head. Every forward goes through it:

- :meth:`~ModelRunner.forward`: ``R`` rows of a linked cache through the whole decoder under a
  :class:`~ragpic.core.forward.Step` (a link's recompute, ``full``, teacher-forced scoring);
- :meth:`~ModelRunner.prefill`: compile's causal forward into an appending cache (no head: a
  compile keeps the KV only);
- :meth:`~ModelRunner.embed`, :meth:`~ModelRunner.layers`, :meth:`~ModelRunner.logits`: the
  same decoder a range of layers at a time, for links that choose their rows between layers
  (CacheBlend after layer 1, the question probe after its shallow layers);
- :meth:`~ModelRunner.decode`: one new token for each of ``B`` requests, each at its own
  position in its own :class:`~ragpic.core.ops.linked_cache.LinkedCache`.

The head is computed one way, :meth:`~ModelRunner.logits`. Decode runs the lean step of
:mod:`ragpic.core.lean_step` where the model's family allows it (its arithmetic without
transformers' per-layer plumbing), else transformers' decoder: one row through
:meth:`~ModelRunner.forward`, or several over a :class:`~ragpic.core.batch.BatchedCache` under
ragpic's attention.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers.cache_utils import Cache

from ragpic.core.batch import BatchedCache, supports_batching
from ragpic.core.forward import Step, cache_kwarg, step_inputs
from ragpic.core.lean_step import LeanStep, lean_step_ok
from ragpic.core.model import LoadedModel
from ragpic.core.ops.attention_probe import AttentionProbe
from ragpic.core.ops.device import to_device
from ragpic.core.ops.linked_cache import LinkedCache
from ragpic.errors import BatchNotHonoured

__all__ = ["ModelRunner", "forward_rows", "recompute_rows", "runner_for"]


class ModelRunner:
    """Every forward of one loaded model (:func:`runner_for` makes it once per model)."""

    def __init__(self, lm: LoadedModel):
        self.lm = lm
        self.decoder = lm.model.base_model
        self._lean = LeanStep(lm, self.decoder, self.logits) if lean_step_ok(lm) else None

    @property
    def lean(self) -> bool:
        """Whether decode runs the lean step (no mask, no step inputs a token)."""
        return self._lean is not None

    @property
    def batches(self) -> bool:
        """Whether :meth:`decode` takes several requests in one forward (the lean step, or ragpic's attention)."""
        return self._lean is not None or supports_batching(self.lm)

    # ----- the whole decoder over rows of a linked cache -----------------------------------------
    def forward(self, cache: LinkedCache, input_ids: torch.Tensor, step: Step, logits_to_keep: int = 1,
                probe: AttentionProbe | None = None) -> torch.Tensor:
        """Run ``(R,)`` ids as ``step`` says, writing their K/V into ``cache``.

        Returns ``(logits_to_keep, V)`` fp32 logits of the last rows (``0`` keeps all R);
        ``cache.length`` becomes ``step.length``. ``probe`` records the last rows' attention
        (only under ragpic's attention, which the caller checks).
        """
        if step.length > cache.capacity:
            raise ValueError(f"linked cache holds {cache.capacity} rows, {step.length} requested")
        kwargs = step.kwargs()
        if probe is not None:
            kwargs["ragpic_probe"] = probe
        out = self.decoder(input_ids=input_ids[None], **{cache_kwarg(self.decoder): cache}, **kwargs)
        cache.length = step.length
        hidden = out.last_hidden_state[0]
        return self.logits(hidden[-logits_to_keep:] if logits_to_keep else hidden, normed=True)

    def prefill(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache: Cache) -> None:
        """A plain causal forward of ``(B, T)`` ids at ``(B, T)`` positions into an appending
        cache (compile). No mask: causal, and padding only trails. No head."""
        self.decoder(input_ids=input_ids, position_ids=position_ids, attention_mask=None, use_cache=True,
                     **{cache_kwarg(self.decoder): cache})

    # ----- the decoder a range of layers at a time ------------------------------------------------
    def embed(self, input_ids: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """``(R,)`` ids at ``(R,)`` device positions -> ``(1, R, hidden)`` states and their rotary ``(cos, sin)``."""
        hidden = self.decoder.embed_tokens(input_ids[None])
        return hidden, self.rotary(hidden, rows)

    def rotary(self, hidden: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The rotary ``(cos, sin)`` of ``(1, R, hidden)`` states at ``(R,)`` device positions."""
        return self.decoder.rotary_emb(hidden, rows[None])

    def layers(self, hidden: torch.Tensor, rotary: tuple[torch.Tensor, ...], cache: LinkedCache, step: Step,
               start: int, stop: int, probe: AttentionProbe | None = None) -> torch.Tensor:
        """Decoder layers ``[start, stop)`` over ``(1, R, hidden)`` states, writing their K/V into
        ``cache`` as ``step`` says; returns the states after them. The caller sets ``cache.length``."""
        kwargs = step.kwargs()
        if probe is not None:
            kwargs["ragpic_probe"] = probe
        for layer in self.decoder.layers[start:stop]:
            out = layer(hidden, position_embeddings=rotary, **{cache_kwarg(layer): cache}, **kwargs)
            hidden = out[0] if isinstance(out, tuple) else out
        return hidden

    def logits(self, hidden: torch.Tensor, *, normed: bool = False) -> torch.Tensor:
        """``(..., hidden)`` last-layer states -> ``(..., V)`` fp32 logits: the final norm
        (unless ``normed``: the decoder applied it) and the head, the one way ragpic computes them."""
        if not normed:
            hidden = self.decoder.norm(hidden)
        head = self.lm.model.get_output_embeddings()  # looked up: quantizing a model replaces its head
        if type(head) is torch.nn.Linear and head.bias is None:
            # ``W @ hidden^T``: the (V, hidden) weight read row-major once for all rows, where
            # ``hidden @ W^T`` makes the CPU BLAS pack it first, again at every step
            # (benchmarks/bench_batch_decode.py times it)
            flat = hidden.reshape(-1, hidden.shape[-1])
            return (head.weight @ flat.t()).t().reshape(*hidden.shape[:-1], -1).float()
        return head(hidden).float()

    # ----- one token per request ------------------------------------------------------------------
    @torch.inference_mode()
    def decode(self, ids: torch.Tensor, positions: Sequence[int], caches: Sequence[LinkedCache], *,
               device_positions: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Feed ``ids[b]`` (``(B,)`` int64 on the model's device) at ``positions[b]`` into
        ``caches[b]`` (rows ``[0, positions[b])`` filled); ``(B, V)`` fp32 next-token logits.

        ``device_positions``: the same ``(B,)`` on the device, and ``mask`` a one-row additive
        mask, when the caller keeps them (decode's buffers: nothing built a token). Each
        cache's ``length`` becomes ``positions[b] + 1``.

        Raises:
            ValueError: several requests on a model neither the lean step nor ragpic's
                attention serves (:func:`~ragpic.core.batch.supports_batching`).
            BatchNotHonoured: the model's attention ignored the batch's per-row caches.
        """
        positions = [int(p) for p in positions]
        for c, p in zip(caches, positions):
            if p >= c.capacity:
                raise ValueError(f"position {p} is past a linked cache of {c.capacity} rows")
        if device_positions is None:
            device_positions = torch.tensor(positions, dtype=torch.long).to(ids.device)
        if self._lean is not None:
            return self._lean(ids, positions, caches, device_positions)
        if len(caches) == 1:
            step = step_inputs(self.lm, device_positions, positions[0] + 1, mask=mask)
            return self.forward(caches[0], ids, step)
        return self._batched(ids, positions, caches, device_positions)

    def _batched(self, ids: torch.Tensor, positions: list[int], caches: Sequence[LinkedCache],
                 device_positions: torch.Tensor) -> torch.Tensor:
        """Several requests through transformers' decoder, each row's attention over its own cache."""
        lm = self.lm
        if not supports_batching(lm):
            raise ValueError("batched decode needs a model on ragpic's attention (load_model(..., banded_attention=True))")
        batch = BatchedCache(caches, positions, lm.sliding_window)
        # A 4D mask passes through transformers' mask builder untouched; batched attention needs none.
        mask = torch.zeros((len(caches), 1, 1, 1), dtype=lm.dtype, device=lm.device)
        out = self.decoder(input_ids=ids.view(-1, 1), position_ids=device_positions.view(-1, 1), attention_mask=mask,
                           use_cache=True, ragpic_bands=batch, **{cache_kwarg(self.decoder): batch})
        if batch.layers_read != lm.num_layers:  # attention ignored the plan: the logits are wrong
            raise BatchNotHonoured(f"batched decode: attention read the per-row caches in {batch.layers_read} of "
                                   f"{lm.num_layers} layers (ragpic_sdpa must hand the step to its plan's attend)")
        for c, p in zip(caches, positions):
            c.length = p + 1
        return self.logits(out.last_hidden_state[:, -1], normed=True)


def runner_for(lm: LoadedModel) -> ModelRunner:
    """The :class:`ModelRunner` of ``lm``, made at its first forward and kept on it."""
    runner = lm.runner
    if not isinstance(runner, ModelRunner) or runner.lm is not lm:
        runner = lm.runner = ModelRunner(lm)
    return runner


def forward_rows(lm: LoadedModel, cache: LinkedCache, input_ids: torch.Tensor, positions: torch.Tensor,
                 length: int, logits_to_keep: int = 1, *, host_positions: torch.Tensor | None = None,
                 mask: torch.Tensor | None = None, probe: AttentionProbe | None = None) -> torch.Tensor:
    """:meth:`ModelRunner.forward` of :func:`~ragpic.core.forward.step_inputs` (``positions``,
    ``length``, ``host_positions``, ``mask``): ``(logits_to_keep, V)`` fp32."""
    step = step_inputs(lm, positions, length, host_positions=host_positions, mask=mask)
    return runner_for(lm).forward(cache, input_ids, step, logits_to_keep, probe)


def recompute_rows(lm: LoadedModel, cache: LinkedCache, ids: torch.Tensor, host_pos: torch.Tensor,
                   length: int, probe: AttentionProbe | None = None, *, causal: bool = False) -> torch.Tensor:
    """One forward of the prompt tokens at ``host_pos`` into ``cache``; ``(V,)`` fp32 logits of the last.

    ``ids``: the prompt's ``(N,)`` host ids; ``host_pos``: ascending host positions;
    ``length``: the last of them + 1. Each row sees the cache's keys up to its own position,
    which must all be written already (rows loaded from the store, or recomputed earlier or in
    this forward): that is what lets a link run as one forward or, in position order, as
    several (:mod:`ragpic.core.link.pieces`). ``causal``: the rows are every row
    ``0..length-1`` (``full``), which SDPA's causal kernel masks where the model allows it.
    """
    rows = to_device(host_pos, lm.device)
    step = step_inputs(lm, rows, length, host_positions=host_pos, causal=causal)
    return runner_for(lm).forward(cache, to_device(ids[host_pos], lm.device), step, probe=probe)[-1]
