"""Link attention on the CPU as one pass over each key block, for every band that reads it.

Banded attention (:mod:`ragpic.core.ops.attention`) runs each band of recomputed rows (a
chunk's first k tokens, the query) over every key it can see: at 4k tokens, 8 calls of 16-32
rows, each reading most of the cache. The CPU flash kernel runs such short bands at ~50 GFLOP/s
against ~90 for `full`'s prefill (benchmarks/attention_kernels.py). Rows are in position order,
so the rows that see a key block *whole* are a suffix of them. Cutting the keys at each band's
first position gives, per band ``i``:

- its *stretch* ``[f_i, f_{i+1})`` (``f`` = a band's first position; the keys before ``f_0``
  form one more stretch), seen whole by every row of bands ``i+1, ...``: one unmasked call
  with all of those rows (up to R of them instead of 16);
- its own rows over ``[f_i, l_i]`` (``l_i`` its last position), causally: one small masked call.

Each call returns its log-sum-exp, and the parts are merged exactly (softmax over the union of
disjoint key sets). Same scores, same keys per row; the sums are regrouped, so results differ
from banded attention by float rounding only (~1e-7 in fp32). CPU and fp32 only: the merge is
done in the output dtype, and on a GPU one banded call per layer already covers everything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


__all__ = ["KeyBlockPlan", "key_block_sdpa", "key_blocks_available", "plan_key_blocks"]


def _flash():
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def key_blocks_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this torch has the CPU flash kernel that returns log-sum-exp, for ``device`` / ``dtype``."""
    return torch.device(device).type == "cpu" and dtype == torch.float32 and _flash() is not None


@dataclass(slots=True, frozen=True)
class KeyBlockPlan:
    """What every layer of one forward runs; built once per forward by :func:`plan_key_blocks`.

    Attributes:
        whole: ``(row_start, key_start, key_end)``: rows ``[row_start, R)`` see keys
            ``[key_start, key_end)`` whole (no mask).
        own: ``(row_start, row_end, key_start, key_end, mask)``: a band's rows over its own
            stretch; ``mask`` ``(1, 1, g x rows, keys)`` (folded per query head) or None.
        rows: R, the forward's query rows.
    """

    whole: tuple[tuple[int, int, int], ...]
    own: tuple[tuple[int, int, int, int, torch.Tensor | None], ...]
    rows: int

    def attend(self, module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout: float,
               scaling: float | None) -> torch.Tensor:
        """The attention plan's entry point (see ``ragpic.core.ops.attention.AttentionPlan``)."""
        return key_block_sdpa(query, key, value, self, scaling)


def plan_key_blocks(bands: Sequence, positions: Sequence[int], mask: torch.Tensor, *, groups: int) -> KeyBlockPlan:
    """Cut the keys at every band's first position (``bands`` from ``query_bands`` without a
    sliding window; ``positions`` the rows' ascending host positions; ``mask`` the forward's
    ``(1, 1, R, N)`` additive mask; ``groups`` query heads per KV head)."""
    firsts = [int(positions[b.row_start]) for b in bands]
    whole = [(0, 0, firsts[0])] if firsts[0] > 0 else []
    own = []
    for i, b in enumerate(bands):
        if i + 1 < len(bands):
            whole.append((bands[i + 1].row_start, firsts[i], firsts[i + 1]))
        last = int(positions[b.row_end - 1])
        m = None
        if last > firsts[i]:  # rows at more than one position: causal inside the stretch
            m = mask[:, :, b.row_start:b.row_end, firsts[i]:last + 1]
            if groups > 1:  # repeated for the g query heads folded into rows, as attention.fold_mask does
                m = m.expand(1, groups, *m.shape[2:]).reshape(1, 1, groups * m.shape[2], m.shape[3])
        own.append((b.row_start, b.row_end, firsts[i], last + 1, m))
    return KeyBlockPlan(tuple(whole), tuple(own), len(positions))


def _fold(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``(1, H, rows, D)`` -> ``(1, H_kv, g x rows, D)``, row ``j x rows + i`` = head ``j``'s row ``i``."""
    _, h, r, d = q.shape
    return q.reshape(1, kv_heads, (h // kv_heads) * r, d)


def key_block_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, plan: KeyBlockPlan,
                   scaling: float | None) -> torch.Tensor:
    """Attention of ``(1, H, R, D)`` queries over ``(1, H_kv, N, D)`` K/V (read in place) by ``plan``.

    Returns ``(1, R, H, D)``, as :func:`~ragpic.core.ops.attention.banded_sdpa` does.
    """
    flash = _flash()
    _, h, r, d = query.shape
    if r != plan.rows:
        raise ValueError(f"key-block plan is for {plan.rows} query rows, the forward has {r}")
    kv_heads = key.shape[1]
    parts = []  # (row_start, row_end, out (1, H, rows, D), lse (1, H, rows))
    calls = [(r0, r, k0, k1, None) for r0, k0, k1 in plan.whole if k1 > k0] + list(plan.own)
    for r0, r1, k0, k1, mask in calls:
        out, lse = flash(_fold(query[:, :, r0:r1], kv_heads), key[:, :, k0:k1], value[:, :, k0:k1],
                         attn_mask=mask, scale=scaling)
        parts.append((r0, r1, out.reshape(1, h, r1 - r0, d), lse.reshape(1, h, r1 - r0)))
    total = torch.full((1, h, r), float("-inf"), dtype=torch.float32, device=query.device)
    for r0, r1, _, lse in parts:
        total[:, :, r0:r1] = torch.logaddexp(total[:, :, r0:r1], lse)
    result = query.new_zeros(1, h, r, d)
    for r0, r1, out, lse in parts:
        result[:, :, r0:r1].addcmul_(out, (lse - total[:, :, r0:r1]).exp_().unsqueeze(-1))
    return result.transpose(1, 2).contiguous()
