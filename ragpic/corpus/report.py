"""A corpus compile's progress bar and its summary, built from the workers' batch results."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from ragpic.corpus.batch import BatchResult, Counts

__all__ = ["CompileReport", "Progress"]


@dataclass(slots=True)
class CompileReport(Counts):
    """What a run did (its :class:`Counts` summed over every batch); ``missing`` > 0 means it
    failed (the chunks are not all in the store).

    Attributes:
        documents: documents read.
        distinct: distinct cacheable chunk texts (the store keys the run checks at its end).
        wall_s: the whole run, reading and chunking included.
        missing: keys of the corpus the store does not hold after the run.
        behind: entries compiled behind the chunks before them in their document
            (``compile_behind``; beside the ``distinct`` plain entries).
        ray: whether it ran on a Ray cluster.
        workers: ``host:pid`` -> that worker's own :class:`Counts` and batch count.
    """

    documents: int = 0
    distinct: int = 0
    wall_s: float = 0.0
    missing: int = 0
    behind: int = 0
    ray: bool = False
    workers: dict[str, dict] = field(default_factory=dict)

    def add(self, b: BatchResult) -> None:
        """Sum a batch into the run and into its worker's share."""
        Counts.add(self, b)
        w = self.workers.setdefault(b.worker, {"batches": 0} | asdict(Counts()))
        w["batches"] += 1
        for name in Counts.__dataclass_fields__:
            w[name] += getattr(b, name)

    @property
    def ok(self) -> bool:
        return self.missing == 0

    def lines(self) -> list[str]:
        """The summary a person reads: what was done, the rates, each worker's share."""
        per = lambda s, n: f"{1000 * s / n:.1f} ms" if n else "-"
        out = [f"{self.documents} documents -> {self.chunks} chunks ({self.distinct} distinct, {self.short} too short "
               f"to cache): {self.compiled} compiled, {self.stored_before} already stored",
               f"{self.tokens} tokens in {self.wall_s:.1f} s"
               + (f" ({self.tokens / self.compile_s:.0f} tokens/s while compiling)" if self.compile_s else "")
               + f"; per chunk: compile {per(self.compile_s, self.compiled)}, encode {per(self.encode_s, self.compiled)},"
                 f" store write {per(self.write_s, self.compiled)}"]
        if self.behind:
            out.append(f"{self.behind} entries compiled behind the chunks before them in their document")
        if len(self.workers) > 1 or self.ray:
            for name, w in sorted(self.workers.items()):
                rate = f"{w['tokens'] / w['compile_s']:.0f} tokens/s" if w["compile_s"] else "idle"
                out.append(f"  worker {name}: {w['batches']} batches, {w['compiled']} chunks, {rate}, "
                           f"write {per(w['write_s'], w['compiled'])}/chunk")
        out.append(f"store check: all {self.distinct} chunks stored" if self.ok else
                   f"FAILED: {self.missing} of {self.distinct} chunks are not in the store")
        return out

    def to_json(self) -> dict:
        return asdict(self) | {"ok": self.ok}


class Progress:
    """A bar over the corpus's chunks: chunks done, tokens/s compiled, ETA (tqdm on stderr)."""

    def __init__(self, total: int, enabled: bool, desc: str = "compiling"):
        from tqdm.auto import tqdm

        self._bar = tqdm(total=total, desc=desc, unit="chunk", disable=not enabled, smoothing=0.1)
        self._t0, self._tokens, self._ahead = time.perf_counter(), 0, 0

    def advance(self, n: int) -> None:
        """``n`` chunks of the running batch compiled (shown before the batch is written)."""
        self._ahead += n
        self._bar.update(n)

    def update(self, b: BatchResult) -> None:
        """A batch is done (compiled and written)."""
        self._tokens += b.tokens
        elapsed = max(time.perf_counter() - self._t0, 1e-9)
        self._bar.set_postfix_str(f"{self._tokens / elapsed:.0f} tok/s", refresh=False)
        self._bar.update(max(b.chunks - self._ahead, 0))
        self._ahead = 0

    def close(self) -> None:
        self._bar.close()
