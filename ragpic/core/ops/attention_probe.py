"""Where the query looks: attention probabilities of a forward's last rows, per layer.

The query-guided link (:mod:`ragpic.core.link.query_guided`) asks, during its first pass, how much
attention the question's tokens pay to each context token, then recomputes the most attended
spans. SDPA does not return its weights, so ragpic's attention function
(:func:`ragpic.core.ops.attention.banded_sdpa`) hands the layer's query and keys to a probe
passed as the ``ragpic_probe`` forward argument; the probe scores only the rows it was asked
for (a few dozen over the whole prompt: ``H x rows x N`` scores per layer, no ``N x N``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["AttentionProbe"]


@dataclass(slots=True)
class AttentionProbe:
    """Collects, layer by layer, the attention the last ``rows`` query rows pay to each key.

    Attributes:
        rows: how many of the forward's last query rows are probed (the question).
        from_layer: the first layer scored; the calls of earlier layers are only counted. The
            probe costs ``H x rows x N`` fp32 scores a layer, so a link that ranks by the
            deeper layers does not pay for the shallow ones.
        layers: one ``(N,)`` fp32 tensor per scored layer, in layer order: softmax
            probabilities summed over the probed rows and every query head (each row's sum
            over keys is 1, so a layer's total is ``rows x H``).
        calls: attention calls seen, scored or not (the next call's layer index).
    """

    rows: int
    from_layer: int = 0
    layers: list[torch.Tensor] = field(default_factory=list)
    calls: int = 0

    def record(self, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None,
               scaling: float | None) -> None:
        """Score one layer. ``query``: ``(1, H, R, D)``; ``key``: ``(1, H_kv, N, D)``;
        ``mask``: ``(1, 1, R, N)`` additive (None: every row sees every key)."""
        self.calls += 1
        if self.calls <= self.from_layer:
            return
        h, r, d = query.shape[1:]
        kv_heads, n = key.shape[1], key.shape[2]
        rows = min(self.rows, r)
        g = h // kv_heads
        # query head i shares KV head i // g (repeat_kv's layout): fold the g heads into rows so
        # the keys are read in place, never repeated per head
        q = query[:, :, r - rows:].float().reshape(1, kv_heads, g * rows, d)
        scores = q @ key.float().transpose(-1, -2) * (scaling if scaling is not None else d ** -0.5)
        if mask is not None:
            m = mask[:, :, r - rows:, :n].float()
            scores = scores + m.expand(1, g, rows, n).reshape(1, 1, g * rows, n)
        self.layers.append(scores.softmax(dim=-1).sum(dim=(0, 1, 2)))

    def scores(self) -> torch.Tensor:
        """``(N,)`` fp32: the per-layer probabilities averaged over the scored layers."""
        if not self.layers:
            raise RuntimeError("the probe saw no attention call past layer "
                               f"{self.from_layer}: the model does not run ragpic's attention")
        return torch.stack(self.layers).mean(dim=0)
