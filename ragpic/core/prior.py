"""A chunk's prior, measured once at compile: which of its tokens' KV moves when text precedes it.

CacheBlend (Yao et al., EuroSys 2025) ranks a prompt's cached tokens by how far their layer-1
values move when layers 0-1 are recomputed over the whole prompt: a pass over every token at
every link. Recipe ``prior`` pays for a ranking once, at compile instead (docs/ARCHITECTURE.md
§4.10): each chunk is prefilled a second time behind :data:`CONTEXT_TEXT`, a fixed neutral
paragraph, and each token's values there are held against its plain ones at every layer. The
tokens that move most are those whose KV depends most on what precedes the chunk; the
``prior-<r>`` methods (:mod:`ragpic.core.link.prior_rows`) recompute them at link, beside
``legolink-k``'s rows, with no pass at link to find them. The prior knows nothing of the
question or of the other chunks: it is a static stand-in for both.
"""

from __future__ import annotations

import torch

from ragpic.core.model import LoadedModel

__all__ = ["CONTEXT_TEXT", "context_ids", "value_deviation"]

CONTEXT_TEXT = (
    "The committee met on Tuesday to review the quarterly figures. Sales in the northern region "
    "rose slightly, while costs for shipping and storage stayed close to the previous year. Two "
    "members asked for a summary of the new supplier contracts, and the chair agreed to circulate "
    "one before the next meeting. The following notes were attached to the minutes.\n\n"
)
"""What every chunk is prefilled behind to measure its prior: ordinary prose that, like a
retrieved neighbour, gives the chunk a sequence start that is not its own (~70 tokens)."""


def context_ids(lm: LoadedModel) -> torch.Tensor:
    """``(P,)`` int64 host ids of :data:`CONTEXT_TEXT` in ``lm``'s tokenizer (no special tokens)."""
    return torch.tensor(lm.tokenizer(CONTEXT_TEXT, add_special_tokens=False)["input_ids"], dtype=torch.long)


def value_deviation(plain: torch.Tensor, moved: torch.Tensor) -> torch.Tensor:
    """``(T,)`` fp32: how far each token's values move, averaged over layers.

    Args:
        plain: ``(L, H, T, D)`` values of the chunk prefilled alone.
        moved: ``(L, H, T, D)`` values of the same tokens prefilled behind context.
    Each layer's squared distance (summed over heads and dims) is divided by that layer's mean
    squared norm of the plain values over the chunk, so no layer dominates by scale alone.
    """
    plain, moved = plain.float(), moved.float()
    dist = (moved - plain).pow(2).sum(dim=(1, 3))  # (L, T)
    scale = plain.pow(2).sum(dim=(1, 3)).mean(dim=1, keepdim=True).clamp_min(1e-12)  # (L, 1)
    return (dist / scale).mean(dim=0)
