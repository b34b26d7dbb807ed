"""A document's chunks compiled behind the chunks before them, and found again in a prompt that
holds them in that order (docs/ARCHITECTURE.md §1.3).

Ingest: :func:`compile_in_order` gives chunk ``i`` of a document (``i >= 1``) the context it
is compiled behind (:func:`ragpic.core.compile.document_contexts`): the ``behind`` chunks before
it, each followed by the separator a prompt puts between two chunks; the entry's recipe (``ctx<N>-<hash>``) names those context ids, so it lives
under its own store key beside the chunk's plain entry. Link: :func:`context_candidates` reads,
for each chunk found in a prompt, the chunks right before it (only whitespace between them) and
gives the recipes of the entries that would have read exactly that text, longest first; the
engine links the first one its store holds and the plain entry otherwise.

Both sides tokenize a context piece by piece (each chunk, each separator alone), as a prompt's
segments are: a chunk compiled behind the prompt's own preceding pieces then holds the KV those
rows would have in a prompt starting with them.

With ``config.compile_head`` set (it is off by default) every such context starts with the
prompt's leading text as the application writes it (:meth:`ragpic.RagPic.compile_head_ids`: the
chat opening, the template's start and system prompt; then the text the application puts before
its first chunk, when given), and the document's first chunk is compiled behind it alone: each entry's
attention sink is then the prompt's own first token and its rows read the instruction, as in
``full``. A prompt links those entries only when its leading text starts with those ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ragpic.cache import chunk_key
from ragpic.cache.format.expect import expected_for
from ragpic.config import MAX_COMPILE_BEHIND as MAX_BEHIND
from ragpic.core.compile import document_contexts
from ragpic.core.kv import ChunkKV
from ragpic.core.compile_recipe import PLAIN, context_recipe
from ragpic.core.methods import Method
from ragpic.core.model import LoadedModel
from ragpic.core.segments import Match
from ragpic.engine.compile_pipeline import ChunkJob, StoreWriter, compile_entries
from ragpic.errors import ConfigError

__all__ = ["Engine", "check_in_order", "compile_in_order", "context_candidates", "context_ids", "entries_behind"]


class Engine(Protocol):
    """What this module reads of its engine (:class:`ragpic.RagPic` is one)."""

    lm: LoadedModel
    config: Any  # ragpic.Config: compile_behind, compile_head, batch_tokens, min_chunk_tokens
    store: Any  # ragpic.cache.ChunkStore: contains_many, put_many, get_many

    def compile_head_ids(self) -> list[int]:
        """The ids every context compiled in order starts with (``config.compile_head``; none when off)."""


def context_ids(tokenizer, pieces: Sequence[str]) -> list[int]:
    """The ids of ``pieces`` tokenized one by one (as the prompt's segments are), concatenated."""
    return [t for p in pieces if p for t in tokenizer(p, add_special_tokens=False)["input_ids"]]


def context_candidates(tokenizer, prompt: str, matches: Sequence[Match], behind: int,
                       head: Sequence[int] = ()) -> dict[int, list[str]]:
    """For each match (by index) with chunks right before it in ``prompt`` (whitespace between
    them only), the recipes of the entries compiled behind ``head`` and its last ``n``
    predecessors and separators, ``n`` from ``min(behind, predecessors)`` down to 1; with a
    ``head``, every match also has the recipe of the entry behind ``head`` alone, last (a
    document's first chunk is compiled behind it)."""
    out: dict[int, list[str]] = {}
    ids: dict[str, list[int]] = {}  # each distinct piece tokenized once

    def piece(text: str) -> list[int]:
        if text not in ids:
            ids[text] = context_ids(tokenizer, [text])
        return ids[text]

    for i in range(0 if head else 1, len(matches)):
        n = 0
        while (n < min(behind, MAX_BEHIND) and i - n - 1 >= 0
               and not prompt[matches[i - n - 1].end:matches[i - n].start].strip()):
            n += 1
        recipes = []
        for k in range(n, 0, -1):
            context = [*head, *(t for j in range(i - k, i)
                                for t in (*piece(matches[j].text), *piece(prompt[matches[j].end:matches[j + 1].start])))]
            recipes.append(context_recipe(context))
        if head:
            recipes.append(context_recipe(list(head)))
        if recipes:
            out[i] = recipes
    return out


def check_in_order(engine: Engine, method: Method, separator: object) -> None:
    """Refuse, before any work, a ``compile(in_order=True)`` that could not be linked as asked."""
    behind = engine.config.compile_behind
    if not 0 < behind <= MAX_BEHIND:
        raise ConfigError(f"compile(in_order=True) needs Config(compile_behind=m) with 1 <= m <= {MAX_BEHIND}, "
                          f"got compile_behind={behind}: set it to how many chunks before each one to compile it behind")
    if method.recipe != PLAIN:
        raise ConfigError(f"method {method.name} links chunks compiled behind dummy tokens: compile(in_order=True) "
                          f"needs a method that links plain chunks (e.g. legolink-16, qr-4-k4-h2-w-s)")
    if not isinstance(separator, str) or separator.strip():
        raise ConfigError(f"separator must be the whitespace a prompt puts between two chunks (e.g. '\\n\\n'), "
                          f"got {separator!r}: a prompt links a chunk behind the chunks before it only where "
                          f"nothing but whitespace lies between them")


def compile_in_order(engine: Engine, texts: Sequence[str], separator: str, *, progress: bool = False) -> int:
    """Compile and store each of ``texts`` (one document's chunks, in order, checked already as
    :func:`~ragpic.engine.compile_plan.plan_compile` checks them) behind the
    ``config.compile_behind`` texts before it, where its store lacks that entry; how many were
    compiled. A text under ``config.min_chunk_tokens`` (never matched) is not compiled behind
    anything. :func:`check_in_order` has passed."""
    behind, lm, texts, head = engine.config.compile_behind, engine.lm, list(texts), engine.compile_head_ids()
    ids = [context_ids(lm.tokenizer, [t]) for t in texts]  # each text tokenized once
    contexts = [head + c for c in document_contexts(ids, behind, glue=context_ids(lm.tokenizer, [separator]))]
    todo = [(i, contexts[i]) for i in range(0 if head else 1, len(ids))
            if len(ids[i]) >= engine.config.min_chunk_tokens]
    keys = [chunk_key(lm.fingerprint, texts[i], context_recipe(ctx), lm.dtype) for i, ctx in todo]
    stored = engine.store.contains_many(keys, texts=[texts[i] for i, _ in todo])
    work = {k: ChunkJob(ids[i], f"texts[{i}] behind the {behind} texts before it", k, texts[i], ctx, i)
            for k, (i, ctx), have in zip(keys, todo, stored) if not have}
    # stored 16 at a time: an interrupted ingest keeps what it finished
    return compile_entries(lm, list(work.values()), batch_tokens=engine.config.batch_tokens,
                           sink=StoreWriter(engine.store, strict=True), every=16, progress=progress,
                           desc="compiling chunk KV behind the chunks before")


def entries_behind(engine: Engine, prompt: str, matches: Sequence[Match],
                   mine: Callable[[str], bool] | None = None) -> dict[int, tuple[str, ChunkKV]]:
    """``match index -> (key, KV)`` of the matches whose store holds an entry compiled behind the
    chunks right before them in ``prompt`` (the longest such context); ``mine``: as
    :meth:`ragpic.RagPic.segments`'s, only keys it accepts."""
    lm, head = engine.lm, engine.compile_head_ids()
    if head and context_ids(lm.tokenizer, [prompt[:matches[0].start]])[:len(head)] != head:
        return {}  # another opening (a raw prompt, another system prompt): its entries read other text
    candidates = context_candidates(lm.tokenizer, prompt, matches, engine.config.compile_behind, head)
    keys = {i: [chunk_key(lm.fingerprint, matches[i].text, r, lm.dtype) for r in recipes]
            for i, recipes in candidates.items()}
    wanted = list(dict.fromkeys(k for ks in keys.values() for k in ks if mine is None or mine(k)))
    if not wanted:
        return {}
    found = engine.store.get_many(wanted, expect=expected_for(lm))
    return {i: next((k, found[k]) for k in ks if k in found) for i, ks in keys.items() if any(k in found for k in ks)}
