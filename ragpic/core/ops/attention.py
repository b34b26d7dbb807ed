"""Banded link attention: exact SDPA for a few query rows over a long cache.

The R recomputed tokens of a link are a few short runs spread over an N-token prompt, and a
token at position ``p`` sees keys ``[0, p]`` only. transformers' SDPA runs one masked ``R x N``
attention and, because a mask is given, first copies K and V per query head. Here the rows are
cut into *bands* that share a visible key range; each band attends only to that range, reading
K and V in place (same scores, same softmax; ~40% fewer attention FLOPs at 4k tokens).

:func:`plan_attention` builds a forward's *attention plan* once (every layer reads it): a
:class:`BandPlan`, or on the CPU in fp32 a :class:`~ragpic.core.ops.key_blocks.KeyBlockPlan`
(one pass per key block), or a batched decode step's per-request caches. Each plan has an
``attend`` method; :func:`banded_sdpa`, registered in transformers' ``AttentionInterface`` under
:data:`ATTENTION_NAME` (:func:`use_banded_attention`), calls it, or transformers' own SDPA when
the forward carries no plan. :func:`grouped_sdpa` is the one SDPA call every plan runs: GQA K/V
read in place, never repeated per query head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from ragpic.core.ops.attention_probe import AttentionProbe
from ragpic.core.ops.device import host_ints
from ragpic.core.ops.key_blocks import key_blocks_available, plan_key_blocks

ATTENTION_NAME = "ragpic_sdpa"
# One SDPA call costs about as much as this many (query row x key) pairs (python, dispatch,
# kernel setup); bands are merged while that is cheaper than attending to a few extra keys.
# Measured on the CPU. A GPU does ~1e5x more pairs per call overhead than a CPU core, so there
# one call over a few extra keys always wins: bands of up to ~512 legolink rows (one band up to
# ~16k tokens, a few at 32k), each a single launch per layer.
CALL_COST = 4096
GPU_CALL_COST = 1 << 18


def call_cost_for(device: torch.device) -> int:
    """The band merge price (in row x key pairs) of one SDPA call on ``device``."""
    return CALL_COST if torch.device(device).type == "cpu" else GPU_CALL_COST


@dataclass(slots=True, frozen=True)
class Band:
    """Query rows ``[row_start, row_end)`` attend to keys ``[key_start, key_end)`` only.

    ``masked`` is False when every row of the band sees every one of its keys (a single row,
    or rows at one position): the band then needs no mask at all.
    """

    row_start: int
    row_end: int
    key_start: int
    key_end: int
    masked: bool = True

    def pairs(self) -> int:
        return (self.row_end - self.row_start) * (self.key_end - self.key_start)

    def merge(self, other: "Band") -> "Band":
        return Band(min(self.row_start, other.row_start), max(self.row_end, other.row_end),
                    min(self.key_start, other.key_start), max(self.key_end, other.key_end))


def query_bands(positions: Sequence[int], *, sliding_window: int | None = None,
                call_cost: int | None = None) -> tuple[Band, ...]:
    """Cut query rows (at these host positions, in row order) into bands of nearby positions.

    A row at position ``p`` sees keys ``(p - sliding_window, p]`` (``[0, p]`` without a
    window), so a band's key range is the union over its rows; every key outside it is
    masked for all of the band's rows and can be skipped without changing the result.
    Adjacent rows are merged greedily while one call over the union costs less than two
    (``call_cost``, default :data:`CALL_COST`, is the price of a call in row x key pairs;
    :func:`call_cost_for` gives each device's).
    """
    call_cost = CALL_COST if call_cost is None else call_cost
    pos = [int(p) for p in positions]
    bands: list[Band] = []
    for row, p in enumerate(pos):
        band = Band(row, row + 1, max(0, p - sliding_window + 1) if sliding_window else 0, p + 1)
        if bands:
            merged = bands[-1].merge(band)
            if merged.pairs() <= bands[-1].pairs() + band.pairs() + call_cost:
                bands[-1] = merged
                continue
        bands.append(band)
    return tuple(_mark_unmasked(b, pos[b.row_start:b.row_end], sliding_window) for b in bands)


def _mark_unmasked(band: Band, rows: list[int], window: int | None) -> Band:
    """``band`` with ``masked=False`` when each of its rows sees all of its keys."""
    sees_all = min(rows) + 1 >= band.key_end and (not window or max(rows) - window + 1 <= band.key_start)
    return Band(band.row_start, band.row_end, band.key_start, band.key_end, masked=not sees_all)


def _query_blocks(rows: int) -> int:
    """How many query blocks torch's CPU flash-attention kernel cuts ``rows`` into (its split:
    32 rows under 192, 64 under 768, else 256); with batch x heads, its parallel work items."""
    split = 256 if rows >= 768 else 64 if rows >= 192 else 32
    return -(-rows // split)


def fold_pays(rows: int, groups: int, kv_heads: int, threads: int) -> bool:
    """Whether, on the CPU, folding the ``groups`` query heads of each KV head into rows is the
    faster call for ``rows`` query rows: it is whenever it leaves the threads as much work as
    ``enable_gqa``'s one item per query head and block (ARCHITECTURE §4.3).

    Folded, each KV head's K/V block is read once for ``groups x rows`` query rows, GEMMs tall
    enough for the bf16 (AMX) and fp32 micro-kernels; ``enable_gqa`` runs each query head
    alone over the same keys. On a 2-core Xeon with AMX (Qwen2.5-0.5B's 14 / 2 heads, 4-8k
    keys) the fold ran 1.0-3x faster per call and a whole link 1.03-1.21x (docs/RESULTS.md
    §32); with one KV head and few rows it would leave threads idle.
    """
    if groups <= 1:
        return False
    return kv_heads * _query_blocks(groups * rows) >= min(threads, groups * kv_heads * _query_blocks(rows))


@dataclass(slots=True, frozen=True)
class BandPlan:
    """Bands plus each band's mask, built once per forward and read by every layer.

    Attributes:
        bands: from :func:`query_bands`.
        masks: per band ``(1, 1, rows, keys)`` additive mask (``(1, 1, g x rows, keys)`` where
            folded: repeated for the ``g`` query heads folded into rows), or None when the
            band is unmasked.
        folds: per band, whether :func:`grouped_sdpa` folds query heads into rows.
    """

    bands: tuple[Band, ...]
    masks: tuple[torch.Tensor | None, ...]
    folds: tuple[bool, ...]

    def attend(self, module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout: float,
               scaling: float | None) -> torch.Tensor:
        """``(1, H, R, D)`` queries over ``(1, H_kv, N, D)`` K/V, band by band -> ``(1, R, H, D)``."""
        b, h, r, _ = query.shape
        if len(self.bands) == 1 and self.bands[0].row_end - self.bands[0].row_start == r:
            (band,), (mask,), (fold,) = self.bands, self.masks, self.folds  # one call: no slice writes
            out = grouped_sdpa(query, key[:, :, band.key_start:band.key_end],
                               value[:, :, band.key_start:band.key_end], mask, dropout, scaling, fold=fold)
            return out.transpose(1, 2).contiguous()
        out = query.new_empty(b, h, r, value.shape[-1])
        for band, mask, fold in zip(self.bands, self.masks, self.folds):
            r0, r1, k0, k1 = band.row_start, band.row_end, band.key_start, band.key_end
            out[:, :, r0:r1] = grouped_sdpa(query[:, :, r0:r1], key[:, :, k0:k1], value[:, :, k0:k1],
                                            mask, dropout, scaling, fold=fold)
        return out.transpose(1, 2).contiguous()


class AttentionPlan(Protocol):
    """What a forward's attention runs, built once per forward: :class:`BandPlan`,
    :class:`~ragpic.core.ops.key_blocks.KeyBlockPlan`, or a batched decode step
    (:class:`ragpic.core.batch.BatchedCache`)."""

    def attend(self, module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout: float,
               scaling: float | None) -> torch.Tensor:
        """``(B, H, R, D)`` queries (and the layer's K/V) -> ``(B, R, H, D)`` attention output."""
        ...


def plan_bands(bands: Sequence[Band], mask: torch.Tensor, *, groups: int, fold: bool | None,
               kv_heads: int = 1) -> BandPlan:
    """Slice (and, where folded, repeat per query head) each band's part of ``mask`` once.

    Without it every layer re-sliced the mask and, folded, copied ``g x rows x keys`` of it:
    one mask copy per band per layer, the main launch cost of banded attention on a GPU.
    ``mask`` is the forward's ``(1, 1, R, N)`` additive mask; ``groups`` is query heads per KV
    head. ``fold``: fold every band (True, a GPU), none (False), or each band where
    :func:`fold_pays` on torch's CPU threads (None; ``kv_heads``: the model's KV heads).
    """
    threads = torch.get_num_threads()
    masks, folds = [], []
    for b in bands:
        f = fold if fold is not None else fold_pays(b.row_end - b.row_start, groups, kv_heads, threads)
        m = mask[:, :, b.row_start:b.row_end, b.key_start:b.key_end] if b.masked else None
        masks.append(fold_mask(m, groups) if m is not None and f and groups > 1 else m)
        folds.append(bool(f))
    return BandPlan(tuple(bands), tuple(masks), tuple(folds))


def banded_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                ragpic_bands: AttentionPlan | Sequence[Band] | None = None, ragpic_probe: AttentionProbe | None = None,
                **kwargs) -> tuple[torch.Tensor, None]:
    """transformers attention-interface function.

    Args:
        query: ``(B, H, R, D)``; key, value: ``(B, H_kv, N, D)`` (not repeated per head).
        attention_mask: ``(1, 1, R, N)`` additive mask, required with bare bands.
        ragpic_bands: the forward's :class:`AttentionPlan` (or bands from :func:`query_bands`,
            planned here); without it this is transformers' SDPA.
        ragpic_probe: records the last rows' attention probabilities (the query-guided link);
            the output does not change.
    Returns:
        ``((B, R, H, D) attention output, None)``.
    """
    if ragpic_probe is not None:
        ragpic_probe.record(query, key, attention_mask, scaling)
    plan = ragpic_bands
    if plan is not None and not hasattr(plan, "attend"):  # bare bands: slice their masks now
        plan = plan_bands(plan, attention_mask, groups=1, fold=False)
    if plan is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    return plan.attend(module, query, key, value, dropout, scaling), None


def uses_banded_attention(model: torch.nn.Module) -> bool:
    """Whether ``model`` runs :func:`banded_sdpa` now: read from its live attention setting,
    so a user who switches the model back to ``sdpa`` gets the one-masked-call path at once."""
    return getattr(model.config, "_attn_implementation", None) == ATTENTION_NAME


def fold_mask(mask: torch.Tensor, groups: int) -> torch.Tensor:
    """``(B, 1, R, S)`` -> ``(B, 1, groups x R, S)``: row ``j x R + i`` is row ``i`` (head ``j``'s copy)."""
    b, _, r, s = mask.shape
    return mask.expand(b, groups, r, s).reshape(b, 1, groups * r, s)


def grouped_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                 dropout: float = 0.0, scaling: float | None = None, *, fold: bool | None = None) -> torch.Tensor:
    """SDPA of ``(B, H, R, D)`` queries over ``(B, H_kv, S, D)`` keys without copying K/V per head.

    Folded, the ``g = H / H_kv`` query heads that share a KV head become rows (the mask is
    repeated for them, unless it already has ``g x R`` rows), which every fused kernel handles;
    otherwise torch's CPU flash kernel takes ``enable_gqa`` with a mask. ``fold`` forces either
    way (a link's plan decides per band, :func:`fold_pays`); None: fold off the CPU only.

    A decode row (one query row per head) always folds. Measured once, 2 threads of an AVX-512
    EPYC, one row over cached keys, per layer: bf16 fold 143 / 193 / 302 us against
    ``enable_gqa``'s 940 / 2,535 / 4,309 us (SmolLM2 at 2k keys, Qwen2.5-0.5B and -1.5B at 3.8k);
    fp32 128 against 113 us (SmolLM2) and 181 against 304 us (0.5B).
    ``mask`` None means every row sees every key.
    Returns ``(B, H, R, D_v)``, in whatever memory layout the kernel chose.
    """
    b, h, r, d = query.shape
    kv_heads = key.shape[1]
    if fold is None:
        fold = query.device.type != "cpu"
    if not fold or h == kv_heads:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling,
                                              enable_gqa=h != kv_heads)
    g = h // kv_heads
    q = query.reshape(b, kv_heads, g * r, d)
    if mask is not None and mask.shape[-2] != g * r:
        mask = fold_mask(mask, g)
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    # reshape, not view: CUDA's memory-efficient kernel returns (B, H_kv, g R, D) in a transposed
    # layout, which no view can split back into heads
    return out.reshape(b, h, r, out.shape[-1])


# ----------------------------------------------------------------------------- a model's plan
# ``lm`` below is a ragpic.core.model.LoadedModel (this layer imports nothing from the core).


def attention_bands(lm: Any, positions: torch.Tensor | Sequence[int]) -> tuple[Band, ...] | None:
    """Bands for query rows at ``(R,)`` **host** positions; None when the model runs another
    attention (``sdpa``, eager, flash), which then sees the full mask. Host positions: cutting
    bands reads every one, and reading a GPU tensor would stall the host (:func:`host_ints`
    refuses one)."""
    if not uses_banded_attention(lm.model):
        return None
    cost = lm.call_cost if lm.call_cost is not None else call_cost_for(lm.device)
    return query_bands(host_ints(positions), sliding_window=lm.sliding_window, call_cost=cost)


def plan_attention(lm: Any, host_positions: torch.Tensor | Sequence[int], mask: torch.Tensor) -> AttentionPlan | None:
    """The forward's plan: :func:`attention_bands` with each band's slice of the ``(1, 1, R, N)``
    ``mask`` built once; several bands on the CPU in fp32 become a key-block plan (``lm.key_blocks``)."""
    if not uses_banded_attention(lm.model):
        return None
    positions = host_ints(host_positions)  # once: the bands and the key blocks both read them
    bands = attention_bands(lm, positions)
    groups = int(lm.model.config.num_attention_heads) // lm.num_kv_heads
    if (lm.key_blocks and len(bands) > 1 and lm.sliding_window is None
            and key_blocks_available(lm.device, mask.dtype)):
        return plan_key_blocks(bands, positions, mask, groups=groups)
    return plan_bands(bands, mask, groups=groups, fold=True if lm.device.type != "cpu" else None,
                      kv_heads=lm.num_kv_heads)


def causal_kernel_ok(lm: Any, length: int) -> bool:
    """Whether a forward over rows ``0..length-1`` may pass no mask and let SDPA's causal kernel
    mask: the live attention is (ragpic's) SDPA and no sliding window cuts keys."""
    impl = getattr(lm.model.config, "_attn_implementation", None)
    return impl in ("sdpa", ATTENTION_NAME) and (lm.sliding_window is None or lm.sliding_window >= length)
