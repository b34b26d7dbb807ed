"""Compile: prefill chunks alone (positions from 0), or behind their document's text before them,
and keep their per-layer K and V."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers.cache_utils import DynamicCache

from ragpic.core.decode import eos_token_ids
from ragpic.core.kv import ChunkKV
from ragpic.core.compile_recipe import PLAIN, context_recipe, recipe_dummies
from ragpic.core.model import LoadedModel
from ragpic.core.ops.device import to_device
from ragpic.core.runner import runner_for
from ragpic.errors import ChunkError

__all__ = ["ChunkInParts", "compile_chunks", "compile_in_context", "document_contexts", "dummy_token_id"]


def dummy_token_id(lm: LoadedModel) -> int:
    """The id LegoLink-0 prepends: BOS as EPIC does, else the first EOS / pad (Qwen has no BOS)."""
    tok = lm.tokenizer
    for cand in (tok.bos_token_id, *eos_token_ids(lm), tok.pad_token_id):
        if cand is not None:
            return int(cand)
    raise ChunkError("the tokenizer has no BOS, EOS or pad token to use as LegoLink-0 dummy")


def _check(ids: torch.Tensor, index: int, dummies: int, lm: LoadedModel) -> None:
    if ids.numel() == 0:
        raise ChunkError(f"chunk {index} is empty: an empty chunk has no KV to compile; drop it", index)
    if ids.numel() + dummies > lm.context_window:
        raise ChunkError(
            f"chunk {index} has {ids.numel()} tokens (+{dummies} rows of dummies or context before it), more than "
            f"the model's context window of {lm.context_window}: split it into smaller chunks (or give less context)",
            index,
        )


def _batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Group chunk indices (sorted by length) so each padded batch holds <= batch_tokens."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    for i in order:
        cur = batches[-1] if batches else None
        if cur and lengths[i] * (len(cur) + 1) <= batch_tokens:
            cur.append(i)
        else:
            batches.append([i])
    return batches


def _with_dummies(lm: LoadedModel, ids: torch.Tensor, dummies: int) -> torch.Tensor:
    """``ids`` ``(T,)`` behind the recipe's ``dummies`` dummy tokens: ``(dummies + T,)`` int64."""
    prefix = torch.full((dummies,), dummy_token_id(lm) if dummies else 0, dtype=torch.long)
    return torch.cat((prefix, ids))


def _chunk_kv(lm: LoadedModel, cache: DynamicCache, row: int, ids: torch.Tensor, dummies: int,
              recipe: str) -> ChunkKV:
    """Batch row ``row`` of a prefilled ``cache`` as one chunk's KV, its ``dummies`` leading rows
    dropped and its padding cut: keys and values ``(L, H, T, D)`` with ``T = ids.numel()``."""
    t = ids.numel()
    keys = torch.stack([layer.keys[row, :, dummies:dummies + t] for layer in cache.layers])  # a copy
    values = torch.stack([layer.values[row, :, dummies:dummies + t] for layer in cache.layers])
    return ChunkKV(token_ids=ids,  # host data: ids never enter a kernel at link
                   keys=keys, values=values, base_position=dummies, fingerprint=lm.fingerprint, recipe=recipe)


@torch.inference_mode()
def compile_chunks(
    lm: LoadedModel,
    chunks: Sequence[Sequence[int] | torch.Tensor],
    *,
    recipe: str = PLAIN,
    batch_tokens: int = 4096,
    on_progress: Callable[[int], None] | None = None,
) -> list[ChunkKV]:
    """Prefill each chunk alone and return its KV, batched by length for throughput.

    Each chunk sits at positions ``0..T-1`` (after ``N`` dummy tokens for recipe ``bosN``,
    whose rows are dropped). Chunks in a batch are right-padded: a causal model never lets a
    real token attend to padding after it, so no attention mask is needed and the K/V of
    every real token equals that of the chunk prefilled on its own.

    Args:
        chunks: token ids of each chunk (no special tokens added).
        recipe: ``plain`` or ``bos<N>`` (LegoLink-0).
        batch_tokens: padded tokens per forward (memory ~ batch_tokens x KV bytes/token).
        on_progress: called with the number of chunks finished after each batch.
    Returns:
        One :class:`ChunkKV` per chunk, in input order: KV on the model's device, ids on the CPU.
    """
    dummies = recipe_dummies(recipe)
    if recipe.startswith("ctx"):
        raise ChunkError(f"recipe {recipe!r} names a context: compile such chunks with compile_in_context")
    ids = [torch.as_tensor(c, dtype=torch.long).reshape(-1) for c in chunks]
    lead = torch.full((dummies,), dummy_token_id(lm) if dummies else 0, dtype=torch.long)
    return _compile(lm, ids, [lead] * len(ids), [recipe] * len(ids), batch_tokens, on_progress)


@torch.inference_mode()
def compile_in_context(
    lm: LoadedModel,
    chunks: Sequence[Sequence[int] | torch.Tensor],
    contexts: Sequence[Sequence[int] | torch.Tensor],
    *,
    batch_tokens: int = 4096,
    on_progress: Callable[[int], None] | None = None,
) -> list[ChunkKV]:
    """Prefill each chunk behind its context (positions from 0) and keep only the chunk's rows.

    The chunk's KV then carries what it read of the text before it (docs/ARCHITECTURE.md §1.3):
    its recipe is :func:`~ragpic.core.methods.context_recipe` of the context and its
    ``base_position`` the context's length, so a link re-rotates it to its place as any chunk's.
    A chunk compiled behind exactly the tokens that precede it in a prompt links with
    ``naive`` to ``full``'s KV, up to rounding. An empty context compiles the chunk ``plain``.

    Args:
        chunks: token ids of each chunk (no special tokens added).
        contexts: token ids of the text before each chunk, one per chunk.
        batch_tokens: padded tokens per forward; on_progress: as :func:`compile_chunks`.
    Returns:
        One :class:`ChunkKV` per chunk, in input order.
    """
    if len(contexts) != len(chunks):
        raise ChunkError(f"contexts has {len(contexts)} entries for {len(chunks)} chunks: give one per chunk")
    ids = [torch.as_tensor(c, dtype=torch.long).reshape(-1) for c in chunks]
    leads = [torch.as_tensor(c, dtype=torch.long).reshape(-1) for c in contexts]
    recipes = [context_recipe(lead.tolist()) for lead in leads]
    return _compile(lm, ids, leads, recipes, batch_tokens, on_progress)


def document_contexts(chunks: Sequence[Sequence[int]], behind: int,
                      glue: Sequence[int] = ()) -> list[list[int]]:
    """The context of each of a document's chunks, in order: the ``behind`` chunks before it,
    each followed by ``glue`` (the ids a prompt puts between two chunks), so chunk ``i`` reads
    what it reads in a prompt holding chunks ``i - behind .. i`` in order. The first chunk's is empty."""
    if behind < 0:
        raise ChunkError(f"behind={behind}: give how many chunks before each one it is compiled behind (>= 0)")
    return [[t for c in chunks[max(0, i - behind):i] for t in (*c, *glue)] for i in range(len(chunks))]


def _compile(lm: LoadedModel, ids: list[torch.Tensor], leads: list[torch.Tensor], recipes: list[str],
             batch_tokens: int, on_progress: Callable[[int], None] | None) -> list[ChunkKV]:
    """Chunk ``i`` ``(T_i,)`` prefilled behind ``leads[i]`` ``(N_i,)`` (dummies or context), batched
    by length; its KV keeps rows ``N_i..N_i + T_i - 1`` and is labelled ``recipes[i]``."""
    for i, (c, lead) in enumerate(zip(ids, leads)):
        _check(c, i, lead.numel(), lm)
    out: list[ChunkKV | None] = [None] * len(ids)
    seqs = [torch.cat((lead, c)) for lead, c in zip(leads, ids)]
    for batch in _batches([s.numel() for s in seqs], batch_tokens):
        width = max(seqs[i].numel() for i in batch)
        rows = torch.zeros((len(batch), width), dtype=torch.long)
        for r, i in enumerate(batch):
            rows[r, : seqs[i].numel()] = seqs[i]
        rows = to_device(rows, lm.device)
        positions = torch.arange(width, device=lm.device).expand(len(batch), width)
        cache = DynamicCache()
        runner_for(lm).prefill(rows, positions, cache)
        for r, i in enumerate(batch):
            out[i] = _chunk_kv(lm, cache, r, ids[i], leads[i].numel(), recipes[i])
        if on_progress:
            on_progress(len(batch))
    return out  # type: ignore[return-value]


class ChunkInParts:
    """One chunk compiled a range of rows at a time: a causal prefill continued over one
    appending cache, each range's rows attending to the ranges before, so the KV is that of
    :func:`compile_chunks` up to rounding. A server compiles a long chunk this way, one bounded
    piece between two decode steps (docs/SERVING.md, *The turn*).

    Args:
        ids: the chunk's token ids, ``(T,)`` int64 (no special tokens added).
        recipe: ``plain`` or ``bos<N>``: its ``N`` dummy rows come first and count as rows.
        index: the chunk's position among the caller's chunks, named by its errors.
    """

    __slots__ = ("lm", "ids", "recipe", "dummies", "index", "seq", "done", "_cache")

    def __init__(self, lm: LoadedModel, ids: Sequence[int] | torch.Tensor, recipe: str = PLAIN, *,
                 index: int = 0):
        self.lm, self.recipe, self.index = lm, recipe, index
        self.ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
        self.dummies = recipe_dummies(recipe)
        if recipe.startswith("ctx"):
            raise ChunkError(f"chunk {index}: recipe {recipe!r} names a context; ChunkInParts compiles "
                             f"'plain' and 'bos<N>' chunks only", index)
        _check(self.ids, index, self.dummies, lm)
        self.seq = _with_dummies(lm, self.ids, self.dummies)  # (dummies + T,)
        self.done = 0  # rows prefilled so far
        self._cache = DynamicCache()

    @property
    def rows(self) -> int:
        """Rows in all, dummies included."""
        return self.seq.numel()

    @torch.inference_mode()
    def run(self, end: int) -> ChunkKV | None:
        """Prefill rows ``[done, end)``; the chunk's KV once ``end`` reaches :attr:`rows`, else None."""
        if not self.done < end <= self.rows:
            raise ChunkError(f"chunk {self.index}: end={end}: the next range of rows must end after row "
                             f"{self.done} and by row {self.rows} (the chunk's end)", self.index)
        dev = self.lm.device
        runner_for(self.lm).prefill(to_device(self.seq[None, self.done:end], dev),
                torch.arange(self.done, end, device=dev)[None], self._cache)
        self.done = end
        if end < self.rows:
            return None
        return _chunk_kv(self.lm, self._cache, 0, self.ids, self.dummies, self.recipe)
