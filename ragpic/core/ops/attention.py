"""Banded link attention: exact SDPA for a few query rows over a long cache.

At link time the R recomputed tokens are a few short runs (each chunk's first k tokens,
glue, the query) spread over an N-token prompt, and a token at position ``p`` sees keys
``[0, p]`` only. transformers' SDPA path runs one masked ``R x N`` attention over every key
and, because a mask is given, first copies K and V once per query head (``repeat_kv``).
Here the rows are cut into *bands* that share a visible key range and each band attends
only to that range, reading K and V in place for every query head that shares them. Same
scores, same mask values, same softmax: at 4k tokens with 8 chunks it does ~40% fewer
attention FLOPs and copies no K/V.

:func:`use_banded_attention` registers the function in transformers' ``AttentionInterface``
under :data:`ATTENTION_NAME` and switches one model to it (an explicit call:
:func:`ragpic.core.model.load_model` makes it for the models it loads; ``wrap_model`` only when
asked). On the CPU in fp32, a forward of several bands runs as one pass per key block instead
(:mod:`ragpic.core.ops.key_blocks`). A forward without ``ragpic_bands`` falls through to
transformers' own SDPA, so the model behaves exactly as before everywhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ragpic.core.ops.attention_probe import AttentionProbe
from ragpic.core.ops.key_blocks import KeyBlockPlan, key_block_sdpa
from ragpic.core.ops.sdpa import fold_mask, grouped_sdpa

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


@dataclass(slots=True, frozen=True)
class BandPlan:
    """Bands plus each band's mask, built once per forward and read by every layer.

    Attributes:
        bands: from :func:`query_bands`.
        masks: per band ``(1, 1, rows, keys)`` additive mask (``(1, 1, g x rows, keys)`` when
            ``fold``: repeated for the ``g`` query heads folded into rows), or None when the
            band is unmasked.
        fold: whether :func:`grouped_sdpa` folds query heads into rows (None: its device default).
    """

    bands: tuple[Band, ...]
    masks: tuple[torch.Tensor | None, ...]
    fold: bool | None


def plan_bands(bands: Sequence[Band], mask: torch.Tensor, *, groups: int, fold: bool | None) -> BandPlan:
    """Slice (and, with ``fold``, repeat per query head) each band's part of ``mask`` once.

    Without it every layer re-sliced the mask and, folded, copied ``g x rows x keys`` of it:
    one mask copy per band per layer, the main launch cost of banded attention on a GPU.
    ``mask`` is the forward's ``(1, 1, R, N)`` additive mask; ``groups`` is query heads per KV head.
    """
    masks = []
    for b in bands:
        m = mask[:, :, b.row_start:b.row_end, b.key_start:b.key_end] if b.masked else None
        masks.append(fold_mask(m, groups) if m is not None and fold and groups > 1 else m)
    return BandPlan(tuple(bands), tuple(masks), fold)


def banded_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                ragpic_bands: BandPlan | Sequence[Band] | None = None, ragpic_probe: AttentionProbe | None = None,
                **kwargs) -> tuple[torch.Tensor, None]:
    """transformers attention-interface function.

    Args:
        query: ``(1, H, R, D)``; key, value: ``(1, H_kv, N, D)`` (not repeated per head).
        attention_mask: ``(1, 1, R, N)`` additive mask, required with bare ``ragpic_bands``.
        ragpic_bands: a :class:`BandPlan` (its masks prebuilt), a
            :class:`~ragpic.core.ops.key_blocks.KeyBlockPlan` (the CPU's pass per key block),
            or bands from :func:`query_bands` (masks sliced here); without it this is
            transformers' SDPA.
        ragpic_probe: records the last rows' attention probabilities (the query-guided link);
            the output does not change.
    Returns:
        ``((1, R, H, D) attention output, None)``.
    """
    if kwargs.get("ragpic_batch") is not None:  # a batched decode step (ragpic.core.batch): per-row caches
        from ragpic.core.ops.batched_attention import batched_sdpa
        return batched_sdpa(module, query, kwargs["ragpic_batch"], dropout=dropout, scaling=scaling)
    if ragpic_probe is not None:
        ragpic_probe.record(query, key, attention_mask, scaling)
    if isinstance(ragpic_bands, KeyBlockPlan):
        return key_block_sdpa(query, key, value, ragpic_bands, scaling), None
    if ragpic_bands is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    if not isinstance(ragpic_bands, BandPlan):
        ragpic_bands = plan_bands(ragpic_bands, attention_mask, groups=1, fold=None)
    b, h, r, _ = query.shape
    fold = ragpic_bands.fold
    if len(ragpic_bands.bands) == 1 and ragpic_bands.bands[0].row_end - ragpic_bands.bands[0].row_start == r:
        (band,), (mask,) = ragpic_bands.bands, ragpic_bands.masks  # one call: no slice writes
        out = grouped_sdpa(query, key[:, :, band.key_start:band.key_end], value[:, :, band.key_start:band.key_end],
                           mask, dropout, scaling, fold=fold)
        return out.transpose(1, 2).contiguous(), None
    out = query.new_empty(b, h, r, value.shape[-1])
    for band, mask in zip(ragpic_bands.bands, ragpic_bands.masks):
        r0, r1, k0, k1 = band.row_start, band.row_end, band.key_start, band.key_end
        out[:, :, r0:r1] = grouped_sdpa(query[:, :, r0:r1], key[:, :, k0:k1], value[:, :, k0:k1],
                                        mask, dropout, scaling, fold=fold)
    return out.transpose(1, 2).contiguous(), None


def uses_banded_attention(model: torch.nn.Module) -> bool:
    """Whether ``model`` runs :func:`banded_sdpa` now: read from its live attention setting,
    so a user who switches the model back to ``sdpa`` gets the one-masked-call path at once."""
    return getattr(model.config, "_attn_implementation", None) == ATTENTION_NAME


def use_banded_attention(model: torch.nn.Module) -> bool:
    """Switch a model that runs transformers' ``sdpa`` to :func:`banded_sdpa`; True when it runs it.

    This is the one place ragpic touches transformers' global ``AttentionInterface``: it
    registers :data:`ATTENTION_NAME` (a new name; no existing entry changes) and sets the
    model's attention to it. ``model.set_attn_implementation("sdpa")`` undoes the switch.
    Models on eager or flash attention are left alone (link then passes the full mask).
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    current = getattr(model.config, "_attn_implementation", None)
    if current != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return uses_banded_attention(model)
    AttentionInterface.register(ATTENTION_NAME, banded_sdpa)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    model.set_attn_implementation(ATTENTION_NAME)
    return uses_banded_attention(model)


def additive_mask(query_positions: torch.Tensor, kv_length: int, *, dtype: torch.dtype,
                  sliding_window: int | None = None) -> torch.Tensor:
    """``(1, 1, R, kv_length)`` additive mask: query at position ``p`` sees keys ``t <= p``.

    Additive (0 / finfo.min) rather than boolean: a boolean mask is wrong under ``eager``
    attention, an additive one is right for both ``eager`` and ``sdpa``. With a sliding
    window ``w`` the query also stops seeing keys ``t <= p - w``, as Mistral does.
    """
    t = torch.arange(kv_length, device=query_positions.device)
    p = query_positions[:, None]
    allowed = t[None, :] <= p
    if sliding_window is not None:
        allowed &= t[None, :] > p - sliding_window
    mask = torch.zeros(allowed.shape, dtype=dtype, device=query_positions.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]
