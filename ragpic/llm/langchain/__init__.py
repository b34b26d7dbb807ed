"""LangChain models backed by ragpic: :class:`RagPicLLM` (completion) and :class:`ChatRagPic` (chat).

Both are thin over one shared :class:`ragpic.RagPic`: the prompt LangChain builds is searched
for stored chunk texts (narrowed by :class:`RetrievalHints` when wired), their KV is loaded
and linked, and only the answer comes back (never the prompt). Usage::

    engine = RagPic(Config(store="index/kv"))
    llm = RagPicLLM(engine=engine, max_new_tokens=64)
    chain = ({"context": retriever | format_docs, "question": RunnablePassthrough()}
             | prompt | llm | StrOutputParser()).with_config(callbacks=[llm.hints])

Generation stats (TTFT, link time, tokens recomputed, chunks matched/loaded/compiled) land in
``generation_info`` (LLM) and ``response_metadata`` / ``usage_metadata`` (chat).

Async methods run the engine in a worker thread and stream through a queue, so the event
loop keeps running. Work on one engine is serialized step by step (one model, one tokenizer);
concurrent streams interleave token by token.
"""

from ragpic.llm.langchain.base import generation_info
from ragpic.llm.langchain.chat import ChatRagPic
from ragpic.llm.langchain.completion import RagPicLLM

__all__ = ["ChatRagPic", "RagPicLLM", "generation_info"]
