"""The engine: :class:`RagPic`, the one object every adapter shares, and the steps it runs
for a prompt beside the core (docs/ARCHITECTURE.md §1-2).

- :mod:`~ragpic.engine.engine`: :class:`RagPic` (owns the model, the store, the step lock and
  the cache memory pool; compile, generate, stream, chat);
- :mod:`~ragpic.engine.segmenting`: which stored texts to look for in a prompt and where each
  chunk's KV came from (store, compiled now, or computed);
- :mod:`~ragpic.engine.prompting`: chat templates, message checks, hints that reached the
  prompt changed;
- :mod:`~ragpic.engine.generation`: what a call returns (:class:`Generation`,
  :class:`GenerationStream`, :class:`MatchStats`).

Importing this package imports torch (through the core); ``import ragpic`` does not.
"""

from ragpic.engine.engine import RagPic
from ragpic.engine.generation import Generation, GenerationStream, MatchStats

__all__ = ["Generation", "GenerationStream", "MatchStats", "RagPic"]
