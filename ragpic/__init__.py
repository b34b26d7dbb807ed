"""ragpic: position-independent KV caching (EPIC / LegoLink) for RAG on your own models.

Two names do the work::

    from ragpic import RagPic, Config

    engine = RagPic(Config(store="index/kv"))          # embedded SmolLM2 unless model= is set
    engine.compile(passages, progress=True)             # once, at ingest
    print(engine.generate(prompt_with_passages).text)   # linked with method="auto"

``kv_folder(index_folder)`` says where an index's KV lives; every error ragpic raises is a
:class:`ragpic.errors.RagPicError`. Framework classes: ``ragpic.llm.llamaindex.RagPicLLM``
and ``ragpic.llm.langchain`` (``RagPicLLM``, ``ChatRagPic``), with ingest and retrieval hooks
in ``ragpic.retriever_hooks``. The layers are described in docs/ARCHITECTURE.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragpic.errors import RagPicError

__version__ = "0.1.0"
__all__ = ["Config", "Generation", "RagPic", "RagPicError", "__version__", "kv_folder"]

if TYPE_CHECKING:
    from ragpic.config import Config, kv_folder
    from ragpic.engine.engine import RagPic
    from ragpic.engine.generation import Generation


def __getattr__(name: str):
    # Lazy: `import ragpic` (e.g. for the CLI's --help) should not pay for torch + transformers.
    if name in ("Config", "kv_folder"):
        from ragpic import config

        return getattr(config, name)
    if name == "RagPic":
        from ragpic.engine.engine import RagPic

        return RagPic
    if name == "Generation":
        from ragpic.engine.generation import Generation

        return Generation
    raise AttributeError(f"module 'ragpic' has no attribute {name!r}")
