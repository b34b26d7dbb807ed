"""LangChain integration: LCEL RAG chains over FAISS with SmolLM2 and MiniLM, no mocks.

The shared engine links with ``legolink-100000`` (k covers every chunk, so every chunk token
is recomputed): its answers must equal ``full`` prefill's, while the KV still comes from the
store (proven by the store's counters and the chunks loaded per call). The shared FAISS store
(fixture ``rag``) is in conftest.py, the chain and recorder in langchain_helpers.py.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from loop_probe import run_with_ticker

pytest.importorskip("langchain_core")
pytest.importorskip("langchain_community")
pytest.importorskip("faiss")

from langchain_helpers import (  # noqa: E402
    K,
    Recorder,
    check_linked,
    model_for,
    rag_chain,
    recorded_chain,
)

from ragpic import Config, RagPic  # noqa: E402
from ragpic.llm.langchain import ChatRagPic, RagPicLLM  # noqa: E402

pytestmark = pytest.mark.integration

@pytest.mark.parametrize("kind", ["llm", "chat"])
def test_chain_loads_stored_kv_and_equals_full(rag, kind):
    engine, retriever, qs = rag["engine"], rag["retriever"], rag["questions"]
    llm, prompt = model_for(rag, kind)
    rec = Recorder(llm.hints)
    chain = rag_chain(retriever, llm, prompt).with_config(callbacks=[llm.hints, rec])

    engine.store.reset_stats()
    answers = [chain.invoke(q) for q in qs]
    stats = engine.store.stats()
    assert stats.misses == 0 and stats.hits == K * len(qs), stats
    check_linked(rec, len(qs))
    # the handler handed the model exactly the retrieved documents, then forgot the run
    assert rec.hinted == [[d.page_content for d in retriever.invoke(q)] for q in qs]
    assert len(llm.hints) == 0

    full = rag_chain(retriever, type(llm)(engine=engine, method="full"), prompt)
    assert answers == [full.invoke(q) for q in qs]
    assert all(a.strip() for a in answers)
    assert not any("Question:" in a or "<|im_start|>" in a for a in answers)  # no prompt echoed


def test_legolink_16_recomputes_little(rag):
    llm = RagPicLLM(engine=rag["engine"], method="legolink-16")
    rec = Recorder()
    chain = rag_chain(rag["retriever"], llm).with_config(callbacks=[llm.hints, rec])
    assert chain.invoke(rag["questions"][0]).strip()
    check_linked(rec, 1)
    info = rec.infos[0]
    # the chunks' own tokens beyond the first 16 came from the store
    assert info["recomputed_tokens"] < info["prompt_tokens"] - 200, info
    assert info["method"] == "legolink-16"


@pytest.mark.parametrize("kind", ["llm", "chat"])
def test_without_handler_engine_finds_chunks(rag, kind):
    llm, prompt = model_for(rag, kind)
    q = rag["questions"][1]
    rec, rec_hinted = Recorder(), Recorder()
    with_hints = rag_chain(rag["retriever"], llm, prompt).invoke(q, config={"callbacks": [llm.hints, rec_hinted]})
    plain = rag_chain(rag["retriever"], llm, prompt).invoke(q, config={"callbacks": [rec]})
    assert plain == with_hints
    check_linked(rec_hinted, 1)
    check_linked(rec, 1, hints=0)  # the store's catalog was searched instead


@pytest.mark.parametrize("kind", ["llm", "chat"])
def test_stream_is_incremental(rag, kind):
    llm, rec, chain = recorded_chain(rag, kind)
    q = rag["questions"][0]
    arrived: list[tuple[float, str]] = []
    for piece in chain.stream(q):
        arrived.append((time.perf_counter(), piece))
    texts = [p for _, p in arrived if p]
    assert len(texts) >= 3, texts
    assert "".join(texts) == chain.invoke(q)
    assert arrived[0][0] < rec.ended_at[0]  # the first piece came before the model finished
    assert rec.tokens[: len(texts)] == texts  # on_llm_new_token saw each piece as it came
    check_linked(rec, 2)


@pytest.mark.parametrize("kind", ["llm", "chat"])
def test_batch_equals_invoke(rag, kind):
    llm, rec, chain = recorded_chain(rag, kind)
    qs = rag["questions"]
    batched = chain.batch(qs)
    check_linked(rec, len(qs))
    assert batched == [chain.invoke(q) for q in qs]


@pytest.mark.parametrize("kind", ["llm", "chat"])
def test_async_does_not_block_the_loop(rag, kind):
    llm, rec, chain = recorded_chain(rag, kind)
    q = rag["questions"][2]
    expected = chain.invoke(q)

    async def work():
        return await chain.ainvoke(q), [p async for p in chain.astream(q)]

    (answer, pieces), ticks = asyncio.run(run_with_ticker(work))
    assert answer == expected
    assert "".join(pieces) == expected and len([p for p in pieces if p]) >= 3
    assert ticks >= 10  # the loop kept running while the model worked
    check_linked(rec, 3)


@pytest.mark.parametrize("kind", ["llm", "chat"])
def test_stop_sequences(rag, kind):
    llm, prompt = model_for(rag, kind)
    q = rag["questions"][0]
    answer = rag_chain(rag["retriever"], llm, prompt).invoke(q)
    words = answer.split()
    assert len(words) >= 3, answer
    stop = " " + words[2]
    cut = answer[: answer.index(stop)]
    bound = rag_chain(rag["retriever"], llm.bind(stop=[stop]), prompt)
    assert bound.invoke(q) == cut
    assert "".join(bound.stream(q)) == cut
    assert asyncio.run(bound.ainvoke(q)) == cut
    # a stop field on the model works as well
    assert rag_chain(rag["retriever"], type(llm)(engine=rag["engine"], stop=[stop]), prompt).invoke(q) == cut


def test_no_engine_is_a_clear_error_and_loads_nothing():
    from ragpic.errors import ConfigError

    for cls in (RagPicLLM, ChatRagPic):
        with pytest.raises(ConfigError, match=f"{cls.__name__} needs engine=.*RagPic"):
            cls()
        with pytest.raises(ConfigError, match="got a str"):
            cls(engine="smollm2")


def test_each_model_reads_only_its_own_hints_handler(tmp_path):
    """Two models on one engine: hints recorded by one model's handler never reach the other."""
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
    from tiny import tiny_lm

    texts = ["the quick brown fox jumps over the lazy dog near dolores park.",
             "question: what is the best thing to do in san francisco? eat a sandwich."]

    class Fixed(BaseRetriever):  # a real retriever that always returns the same two documents
        def _get_relevant_documents(self, query, *, run_manager=None):
            return [Document(page_content=t) for t in texts]

    lm = tiny_lm("llama", num_hidden_layers=2)
    engine = RagPic(Config(store=None, max_new_tokens=2), lm=lm)
    engine.compile(texts)
    wired, other = RagPicLLM(engine=engine), RagPicLLM(engine=engine)
    rec = Recorder()
    rag_chain(Fixed(), wired).with_config(callbacks=[wired.hints, rec]).invoke("what to do?")
    assert rec.infos[-1]["hints"] == 2 and rec.infos[-1]["chunks_loaded"] == 2
    rec_other = Recorder()
    rag_chain(Fixed(), other).with_config(callbacks=[wired.hints, rec_other]).invoke("what to do?")
    assert rec_other.infos[-1]["hints"] == 0  # `wired`'s handler saw the run, `other` never reads it
    assert rec_other.infos[-1]["chunks_loaded"] == 2  # found by exact text anyway
