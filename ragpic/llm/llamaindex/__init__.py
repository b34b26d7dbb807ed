"""LlamaIndex side of ragpic: :class:`RagPicLLM` (a ``CustomLLM`` that links cached chunk KV)
and :func:`make_query_engine` (a query engine whose synthesizer never re-splits node text).

::

    from ragpic.llm.llamaindex import RagPicLLM, make_query_engine

    llm = RagPicLLM(engine, max_new_tokens=128)
    print(make_query_engine(index, llm, similarity_top_k=4).query("Who ...?"))
"""

from ragpic.errors import ContextOverflowError
from ragpic.llm.llamaindex.llm import RagPicLLM
from ragpic.llm.llamaindex.query_engine import RagPicSynthesizer, make_query_engine

__all__ = ["ContextOverflowError", "RagPicLLM", "RagPicSynthesizer", "make_query_engine"]
