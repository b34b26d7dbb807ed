"""A prompt's chunks looked up in the store: segments with KV loaded, or compiled on a miss.

The data path's store step (docs/ARCHITECTURE.md §2): :func:`segments_of` finds the prompt's
chunks (:mod:`ragpic.engine.segmenting`), loads each one's entry (compiled behind the chunks
before it where the store holds one, §1.3), and compiles what is missing through the one
compile pipeline (:func:`store_jobs`), which a server replaces with its pieces between decode steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ragpic.cache.format.expect import expected_for
from ragpic.core.compile_recipe import PLAIN
from ragpic.core.kv import ChunkKV
from ragpic.core.link import linker_for
from ragpic.core.methods import Method
from ragpic.core.model import LoadedModel
from ragpic.core.segments import Segment, split_prompt, text_segment
from ragpic.engine.compile_pipeline import ChunkJob, StoreWriter, compile_entries, text_jobs
from ragpic.engine.generation import MatchStats
from ragpic.engine.in_order import entries_behind
from ragpic.engine.segmenting import build_segments, match_chunks

__all__ = ["Looker", "segments_of", "store_jobs"]

CompileMissing = Callable[[list[tuple[str, str]], Method], dict[str, ChunkKV]]


class Looker(Protocol):
    """What a lookup reads of its engine (:class:`ragpic.RagPic` is one)."""

    lm: LoadedModel
    config: Any  # ragpic.Config: batch_tokens, compile_behind, compile_on_miss
    store: Any  # ragpic.cache.ChunkStore

    def chunk_key(self, text: str, method: Method | None = None) -> str: ...

    def cacheable(self, text: str) -> bool: ...

    def compile_head_ids(self) -> list[int]: ...


def store_jobs(engine: Looker, jobs: list[ChunkJob], method: Method, *, progress: bool = False,
               strict: bool = False) -> dict[str, ChunkKV]:
    """Compile and store ``jobs`` 64 at a time (:mod:`ragpic.engine.compile_pipeline`): an
    interrupted ingest keeps what it finished; ``key -> KV`` as a read of each entry returns it.
    ``strict``: a failed store write raises (ingest) instead of being logged (a query's miss)."""
    writer = StoreWriter(engine.store, strict=strict, keep=True)
    compile_entries(engine.lm, jobs, method.recipe, batch_tokens=engine.config.batch_tokens, sink=writer,
                    every=64, progress=progress)
    return writer.kvs


def segments_of(engine: Looker, text: str, hints: Sequence[str] | None, method: Method,
                mine: Callable[[str], bool] | None = None,
                compile_missing: CompileMissing | None = None) -> tuple[list[Segment], MatchStats]:
    """Template-formatted prompt ``text`` as segments, each chunk's KV loaded or compiled
    (:meth:`ragpic.RagPic.segments` gives the arguments)."""
    tok = engine.lm.tokenizer

    def catalog():
        found = _stored_texts_in(engine.store, text)
        return found if mine is None else [t for t in found if mine(engine.chunk_key(t, method))]

    matches, stats = match_chunks(text, hints, catalog, engine.cacheable)
    if not matches:
        return [text_segment(tok, text)], stats
    if linker_for(method).every_row:  # the same token sequence the linked methods see, all computed
        return [text_segment(tok, p) for p, _ in split_prompt(text, matches)], stats
    behind = (entries_behind(engine, text, matches, mine)
              if engine.config.compile_behind and method.recipe == PLAIN else {})
    keys = {m.text: engine.chunk_key(m.text, method) for i, m in enumerate(matches) if i not in behind}
    wanted = [k for k in dict.fromkeys(keys.values()) if mine is None or mine(k)]
    kvs = engine.store.get_many(wanted, expect=expected_for(engine.lm))
    stats.loaded, stats.behind = len(kvs) + len({k for k, _ in behind.values()}), len(behind)
    from_store = set(kvs)
    missing = [(k, t) for t, k in keys.items() if k not in kvs]
    if missing and engine.config.compile_on_miss:
        if compile_missing is not None:
            compiled = compile_missing(missing, method)  # already as a read returns them
        else:
            compiled = store_jobs(engine, text_jobs(tok, missing), method)
        kvs.update(compiled)
        stats.compiled = len(compiled)
    return build_segments(tok, text, matches, keys, kvs, from_store, stats, behind), stats


def _stored_texts_in(store, text: str):
    """Stored chunk texts to look for in ``text``: the candidates the store's catalog finds
    by anchor, O(prompt) lookups (docs/ARCHITECTURE.md §2), or its cached texts when the
    backend cannot answer (its server stalled or is down)."""
    found = store.candidates(text)
    return found if found is not None else store.texts().values()
