"""The one compile pipeline: chunks, the context each is compiled behind and a recipe in; entries out.

Every compile in ragpic runs :func:`compile_entries`: ``RagPic.compile`` and a miss compiled
while a prompt is planned, in-order ingest (:mod:`ragpic.engine.in_order`), a corpus batch in
process or on Ray (:mod:`ragpic.corpus.batch`), the server's pieces between decode steps
(:mod:`ragpic.engine.compiling`), and the evaluations and calibration
(:func:`ragpic.eval.variants.compile_for`). So every caller gets:

- one batching policy: :mod:`ragpic.core.compile`'s length-sorted batches of at most
  ``batch_tokens`` padded rows, within groups of ``every`` chunks; each group goes to the sink
  as it finishes, so an interrupted ingest keeps the groups it finished (docs/ARCHITECTURE.md §1.1);
- one error: a :class:`~ragpic.errors.ChunkError` that names the failing chunk by its
  :attr:`ChunkJob.where` (``texts[3]``, ``essay.md#3``) and carries its :attr:`ChunkJob.index`;
- one writer of compiled entries, :class:`StoreWriter`; an evaluation's sink keeps the KV
  instead, so calibration measures the KV a store's entries are made from.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ragpic.core.compile import compile_chunks, compile_in_context
from ragpic.core.compile_recipe import PLAIN
from ragpic.core.kv import ChunkKV
from ragpic.core.model import LoadedModel
from ragpic.errors import ChunkError, ConfigError

__all__ = ["ChunkJob", "Sink", "StoreWriter", "compile_entries", "text_jobs"]


@dataclass(slots=True)
class ChunkJob:
    """One chunk to compile.

    Attributes:
        ids: its token ids, tokenized alone (no special tokens added).
        where: how an error names it (``texts[3]``, ``essay.md#3``, ``a chunk``).
        key: its store key (empty when its KV is not stored: an evaluation's).
        text: its text, catalogued with the entry.
        context: the ids it is compiled behind (recipe ``ctx<N>-<hash>``; empty: ``plain``), or
            None: compiled alone with the pipeline's recipe (``plain``, ``bos<N>``).
        index: the number its :class:`ChunkError` carries (its place in the caller's list).
    """

    ids: list[int]
    where: str
    key: str = ""
    text: str = ""
    context: list[int] | None = None
    index: int | None = None


Sink = Callable[[Sequence[ChunkJob], list[ChunkKV]], None]
"""Takes each finished group: its jobs and their KV (same order, on the model's device)."""


def text_jobs(tokenizer, todo: Sequence[tuple[str, str]], wheres: Sequence[str] | None = None,
              indices: Sequence[int | None] | None = None) -> list[ChunkJob]:
    """``(key, text)`` pairs as jobs, each text tokenized alone; ``wheres[i]`` names pair ``i``
    in errors (default ``a chunk``: the error quotes its text's start anyway), ``indices[i]`` is the
    index its error carries."""
    return [ChunkJob(tokenizer(text, add_special_tokens=False)["input_ids"],
                     wheres[i] if wheres is not None else "a chunk", key, text,
                     index=indices[i] if indices is not None else i)
            for i, (key, text) in enumerate(todo)]


def compile_entries(lm: LoadedModel, jobs: Sequence[ChunkJob], recipe: str = PLAIN, *, batch_tokens: int,
                    sink: Sink, every: int | None = None, progress: bool = False,
                    desc: str = "compiling chunk KV", on_progress: Callable[[int], None] | None = None) -> int:
    """Compile ``jobs`` and hand them to ``sink`` ``every`` at a time (None: all in one group);
    how many were compiled.

    A job with a ``context`` is compiled behind it, one without alone under ``recipe``; a group
    holding both compiles the context-free ones behind an empty context, which is ``plain``, so
    ``recipe`` must then be ``plain``. ``progress``: a bar titled ``desc``; ``on_progress(n)``:
    ``n`` more chunks compiled.

    Raises:
        ChunkError: a chunk that cannot be compiled (empty, longer than the window), named by its
            ``where`` and carrying its ``index``; the groups before it reached the sink.
        ConfigError: contexts given with a recipe that is not ``plain``.
    """
    jobs = list(jobs)
    if not jobs:
        return 0
    if recipe != PLAIN and any(j.context is not None for j in jobs):
        raise ConfigError(f"recipe {recipe!r} compiles chunks behind dummy tokens: it cannot also compile them "
                          f"behind a context; give contexts with the 'plain' recipe only")
    from tqdm.auto import tqdm

    bar = tqdm(total=len(jobs), desc=desc, unit="chunk", disable=not progress)

    def advance(n: int) -> None:
        bar.update(n)
        if on_progress is not None:
            on_progress(n)

    step = every or len(jobs)
    try:
        for lo in range(0, len(jobs), step):
            group = jobs[lo:lo + step]
            try:
                if any(j.context is not None for j in group):
                    kvs = compile_in_context(lm, [j.ids for j in group], [j.context or [] for j in group],
                                             batch_tokens=batch_tokens, on_progress=advance)
                else:
                    kvs = compile_chunks(lm, [j.ids for j in group], recipe=recipe, batch_tokens=batch_tokens,
                                         on_progress=advance)
            except ChunkError as e:
                job = group[e.index or 0]
                text = f" [text starts {job.text[:60]!r}]" if job.text else ""
                said = str(e)  # the core names the chunk by its place in the group: name it the caller's way
                if re.match(r"chunk \d+", said):
                    said = re.sub(r"^chunk \d+", job.where, said)
                else:
                    said = f"{job.where}: {said}"
                raise ChunkError(said + text, lo + (e.index or 0) if job.index is None else job.index) from e
            sink(group, kvs)
    finally:
        bar.close()
    return len(jobs)


@dataclass
class StoreWriter:
    """The sink that stores: each group's entries encoded (quantized, serialized) and written.

    The server splits the two halves across threads: :meth:`encode` on the model thread (tensor
    work), :meth:`write` on a request's thread (I/O only); ``writer(jobs, kvs)`` does both.

    Args:
        store: a :class:`~ragpic.cache.ChunkStore`.
        strict: a failed encode or write raises (ingest) instead of being logged and skipped (a query's).
        keep: remember ``key -> KV`` as a read of each entry returns it (:attr:`kvs`).

    Attributes:
        kvs: (``keep``) each job's KV as a read of its entry returns it; the KV itself where the
            entry could not be encoded (not strict), as no read will ever differ from it.
        written: the keys the store now holds.
        encode_s / write_s: seconds spent in each half.
    """

    store: Any
    strict: bool = True
    keep: bool = False
    kvs: dict[str, ChunkKV] = field(default_factory=dict)
    written: list[str] = field(default_factory=list)
    encode_s: float = 0.0
    write_s: float = 0.0

    def encode(self, jobs: Sequence[ChunkJob], kvs: Sequence[ChunkKV]):
        """The entries of ``jobs`` as bytes and as a read returns them (``ChunkStore.encode_many``)."""
        t0 = time.perf_counter()
        encoded = self.store.encode_many({j.key: (kv.to("cpu"), j.text) for j, kv in zip(jobs, kvs)},
                                         strict=self.strict)
        self.encode_s += time.perf_counter() - t0
        if self.keep:
            self.kvs.update({j.key: encoded.read_form.get(j.key, kv) for j, kv in zip(jobs, kvs)})
        return encoded

    def write(self, encoded) -> list[str]:
        """Write encoded entries (hot tier, backend, catalog); the keys the store now holds."""
        t0 = time.perf_counter()
        stored = self.store.write(encoded, strict=self.strict)
        self.write_s += time.perf_counter() - t0
        self.written += stored
        return stored

    def __call__(self, jobs: Sequence[ChunkJob], kvs: list[ChunkKV]) -> None:
        self.write(self.encode(jobs, kvs))
