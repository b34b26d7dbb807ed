"""What a server sets on a request's plan beside the prompt and sampling: :class:`PlanOptions`,
passed to :meth:`ragpic.RagPic.plan` as ``options`` (``stream`` and ``generate`` take the defaults)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ragpic.core.kv import ChunkKV
    from ragpic.core.methods import Method
    from ragpic.core.ops.linked_cache import SlabPool

__all__ = ["PlanOptions"]


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """A request's plan settings that only a server sets (``ragpic.serve.running.begin``).

    Attributes:
        pool: the cache memory the request's KV lives in (None: the engine's own pool).
        piece_rows: most recomputed rows per link piece, so a long link runs in turns between
            other requests' decode steps (None: the link is one piece).
        max_prompt_tokens: a smaller prompt limit than the model's window (the server's
            ``--max-prompt-tokens``); over it ``plan`` raises ``ContextOverflowError``.
        cache_salt: the prompt's leading text links only from KV kept by requests of the same
            salt: the server passes each namespace's name (:mod:`ragpic.engine.prefix`).
        mine: the store keys the caller may find (a server's tenants): any other chunk is a
            miss, as if nobody had stored it (None: every key), see :meth:`ragpic.RagPic.segments`.
        compile_missing: compiles and stores the misses ``[(key, text)]`` for the method and
            returns ``key -> KV`` as a read of its entry does (None: the engine compiles them at
            once; the server's scheduler compiles them in pieces between decode steps).
    """

    pool: SlabPool | None = None
    piece_rows: int | None = None
    max_prompt_tokens: int | None = None
    cache_salt: str = ""
    mine: Callable[[str], bool] | None = None
    compile_missing: Callable[[list[tuple[str, str]], Method], dict[str, ChunkKV]] | None = None
