"""What a corpus compile is: the settings every worker of one run shares (picklable, no torch).

One :class:`CompileJob` goes to every worker, in process or on a Ray cluster, so every worker
builds the same engine (model, weights, dtype, KV format, compile recipe) and writes the same
content-addressed keys into the same store (ARCHITECTURE §4.4): a chunk compiled twice, by a
retry or a second run, lands on the same entry.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ragpic.config import Config
from ragpic.core.compile_recipe import PLAIN
from ragpic.core.methods import parse_method
from ragpic.corpus.chunking import check_chunking
from ragpic.errors import UsageError

__all__ = ["SEPARATOR", "CompileJob"]

SEPARATOR = "\n\n"
"""What LlamaIndex's and LangChain's prompts put between two retrieved chunks: the text a chunk
is compiled behind after each chunk before it (``compile_behind``)."""


@dataclass(frozen=True, slots=True)
class CompileJob:
    """Attributes:
        store: the store spec every worker writes into (a folder, ``redis://``, ``redis-cluster://``).
        model, dtype, weights, kv_quant, method: as in :class:`ragpic.Config` (``method`` picks the
            compile recipe: ``legolink-0`` compiles behind dummy rows, every other method plain).
        chunker, chunk_tokens: how documents become chunks (:mod:`ragpic.corpus.chunking`).
        batch_chunks: chunks one worker compiles and writes per batch (a retry redoes at most one).
        threads: torch CPU threads per worker (0: torch's choice).
        compile_behind: also compile each chunk behind the ``compile_behind`` chunks before it in
            its document, each followed by :data:`SEPARATOR` (ARCHITECTURE §1.3); a query engine
            with ``Config(compile_behind=m)`` links those entries where a prompt holds the
            chunks in that order. In process only: a Ray batch may split a document.
        compile_head: what those entries read first, as ``Config.compile_head`` (``None``: its
            default, nothing but the chunks before; a text: the chat opening, then the text the
            application's prompts put before their first chunk); a server links them with the
            same setting.
    """

    store: str
    model: str | None = None
    dtype: str | None = None
    weights: str = "auto"
    kv_quant: str = "int8"
    method: str = "auto"
    chunker: str = "llamaindex"
    chunk_tokens: int = 512
    batch_chunks: int = 32
    threads: int = 0
    compile_behind: int = 0
    compile_head: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.store, str) or not self.store.strip() or self.store == "memory":
            raise UsageError(f"store must be a folder or a redis:// URL that outlives the run, got {self.store!r}")
        check_chunking(self.chunker, self.chunk_tokens)  # the chunker's own rule, before any model loads
        if not isinstance(self.batch_chunks, int) or self.batch_chunks < 1:
            raise UsageError(f"batch_chunks must be a whole number >= 1, got {self.batch_chunks!r}")
        self.config()  # model, dtype, weights, KV format and method checked before any work
        method = parse_method(self.method)
        if self.compile_behind and method.kind != "auto" and method.recipe != PLAIN:
            raise UsageError(f"compile_behind needs a method that links plain chunks (e.g. legolink-16), "
                             f"got method {self.method!r}, which compiles behind dummy tokens")

    def config(self) -> Config:
        """The engine's settings: no hot tier (ingest reads nothing back), no compile on miss."""
        return Config(model=self.model, dtype=self.dtype, weights=self.weights, kv_quant=self.kv_quant,
                      method=self.method, store=self.store, memory_cache_mb=0, store_stats_interval_s=0,
                      compile_behind=self.compile_behind,
                      **({} if self.compile_head is None else {"compile_head": self.compile_head}))

    def to_dict(self) -> dict:
        return asdict(self)
