"""The lean decode step: one new token for each of ``B`` requests, straight through the model's modules.

A decode step is a one-row forward per request, bound by the bytes of weights it reads; the
generic path (transformers' decoder over a :class:`~ragpic.core.batch.BatchedCache`) spends
as long again on Python around them: masks, keyword plumbing, the cache protocol, per layer.
:class:`LeanStep` keeps only the arithmetic: it calls the model's own norms, projections,
rotary embedding and MLP (so the numbers are the model's), writes each row's K/V into its
request's :class:`~ragpic.core.ops.linked_cache.LinkedCache` at its position and runs SDPA over
that cache in place (docs/ARCHITECTURE.md §4.8). It serves the decoder families whose layers
are ``input_layernorm -> self_attn -> post_attention_layernorm -> mlp`` with rotary Q/K
(llama, mistral, qwen2, qwen3; :func:`lean_step_ok`); the
:class:`~ragpic.core.runner.ModelRunner` owns it and decodes any other model (gemma) through
transformers' decoder.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ragpic.core.model import LoadedModel
from ragpic.core.ops.attention import grouped_sdpa
from ragpic.core.ops.linked_cache import LinkedCache

__all__ = ["LeanStep", "lean_step_ok"]

_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def lean_step_ok(lm: LoadedModel) -> bool:
    """Whether ``lm``'s family has the layer shape :class:`LeanStep` computes (no logit soft-capping)."""
    config = lm.model.config
    if getattr(config, "model_type", None) not in _FAMILIES:
        return False
    base = lm.model.base_model
    if not all(hasattr(base, a) for a in ("embed_tokens", "norm", "rotary_emb", "layers")):
        return False
    return not (getattr(config, "final_logit_softcapping", None) or getattr(config, "attn_logit_softcapping", None))


class LeanStep:
    """Feed ``B`` tokens, each at its own position into its own cache; ``(B, V)`` fp32 logits.

    ``decoder``: the model's base model; ``logits``: ``(B, hidden)`` last-layer states ->
    ``(B, V)`` fp32 (the runner's head).
    """

    def __init__(self, lm: LoadedModel, decoder: torch.nn.Module,
                 logits: Callable[[torch.Tensor], torch.Tensor]):
        self.decoder = decoder  # its modules read at each step: quantizing a model replaces them
        self.logits = logits
        attn = decoder.layers[0].self_attn
        self.head_dim = lm.head_dim
        self.scaling = float(attn.scaling)
        self.qk_norm = hasattr(attn, "q_norm")
        self.window = lm.sliding_window

    def __call__(self, ids: torch.Tensor, positions: Sequence[int], caches: Sequence[LinkedCache],
                 device_positions: torch.Tensor) -> torch.Tensor:
        """``ids``: ``(B,)`` int64 on the model's device; ``positions[b]``: where ``ids[b]`` sits
        (its cache's rows ``[0, positions[b])`` filled, checked by the runner);
        ``device_positions``: the same ``(B,)`` on the device. Each cache's ``length`` becomes
        ``positions[b] + 1``."""
        bsz, dh = ids.shape[0], self.head_dim
        pos = device_positions.view(bsz, 1)
        h = self.decoder.embed_tokens(ids.view(bsz, 1))  # (B, 1, D)
        cos, sin = self.decoder.rotary_emb(h, pos)  # (B, 1, dh) in the model dtype
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, 1, dh): broadcast over heads
        starts = [max(0, p - self.window + 1) if self.window else 0 for p in positions]
        for i, layer in enumerate(self.decoder.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(bsz, 1, -1, dh).transpose(1, 2)  # (B, H, 1, dh)
            k = attn.k_proj(x).view(bsz, 1, -1, dh).transpose(1, 2)  # (B, H_kv, 1, dh)
            v = attn.v_proj(x).view(bsz, 1, -1, dh).transpose(1, 2)
            if self.qk_norm:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            out = q.new_empty(bsz, q.shape[1], 1, dh)
            for b, (c, p, s) in enumerate(zip(caches, positions, starts)):
                keys, values = c.key_slab[i], c.value_slab[i]  # (1, H_kv, capacity, dh)
                keys[0, :, p] = k[b, :, 0]
                values[0, :, p] = v[b, :, 0]
                # a decode row folds its g query heads into rows (grouped_sdpa's measured rule)
                out[b:b + 1] = grouped_sdpa(q[b:b + 1], keys[:, :, s:p + 1], values[:, :, s:p + 1], None, 0.0,
                                            self.scaling, fold=True)
            h = h + attn.o_proj(out.transpose(1, 2).reshape(bsz, 1, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        for c, p in zip(caches, positions):
            c.length = p + 1
        return self.logits(h[:, 0])
