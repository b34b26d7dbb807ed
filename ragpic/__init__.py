"""ragpic: position-independent KV caching (EPIC / LegoLink) for RAG on your own models.

Two names do the work::

    from ragpic import RagPic, Config

    engine = RagPic(Config(store="index/kv"))          # embedded SmolLM2 unless model= is set
    engine.compile(passages, progress=True)             # once, at ingest
    print(engine.generate(prompt_with_passages).text)   # linked with legolink-16

Framework classes: ``ragpic.llm.llamaindex.RagPicLLM`` and ``ragpic.llm.langchain``
(``RagPicLLM``, ``ChatRagPic``), with ingest and retrieval hooks in ``ragpic.retriever_hooks``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["RagPic", "Config", "Generation", "__version__"]

if TYPE_CHECKING:
    from .config import Config
    from .engine import Generation, RagPic


def __getattr__(name: str):
    # Lazy: `import ragpic` (e.g. for the CLI's --help) should not pay for torch + transformers.
    if name == "Config":
        from .config import Config

        return Config
    if name in ("RagPic", "Generation"):
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'ragpic' has no attribute {name!r}")
