"""LlamaIndex end to end: ingest and query engines over SmolLM2 + MiniLM + FAISS, real LlamaIndex objects.

The shared index (fixtures ``built``, ``question``, ``embed``) is in conftest.py.

Run: OMP_NUM_THREADS=1 .venv/bin/pytest tests/adapters/test_llamaindex.py -m integration
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from loop_probe import run_with_ticker

pytest.importorskip("llama_index.core")
pytest.importorskip("llama_index.vector_stores.faiss")
pytest.importorskip("llama_index.embeddings.huggingface")

from llama_index.core import Document, VectorStoreIndex  # noqa: E402
from llama_index.core.ingestion import IngestionPipeline  # noqa: E402
from llama_index.core.node_parser import SentenceSplitter  # noqa: E402
from llama_index.core.postprocessor.types import BaseNodePostprocessor  # noqa: E402

from ragpic import Config, RagPic  # noqa: E402
from ragpic.llm.llamaindex import RagPicLLM, make_query_engine  # noqa: E402
from ragpic.retriever_hooks.llamaindex import RagPicIngest, compile_index, current_hints, node_text  # noqa: E402

pytestmark = pytest.mark.integration

TOP_K = 4
NEW = 16


class Reverse(BaseNodePostprocessor):
    """Reorders the retrieved nodes (last first)."""

    def _postprocess_nodes(self, nodes, query_bundle=None):
        return list(reversed(nodes))


class DuplicateFirst(BaseNodePostprocessor):
    """Puts the best node in the prompt twice."""

    def _postprocess_nodes(self, nodes, query_bundle=None):
        return [*nodes, nodes[0]]


def _hits(engine) -> tuple[int, int]:
    s = engine.store.stats()
    return s.memory_hits + s.backend_hits, s.misses


# ----- ingest -------------------------------------------------------------------------------


def test_ingest_compiles_node_text_with_metadata(built):
    folder, engine, index = built
    nodes = list(index.docstore.docs.values())
    assert len(nodes) == 9
    texts = [node_text(n) for n in nodes]
    assert all(t.startswith("title: ") and "\nrank: " in t and "internal_id" not in t for t in texts)
    assert engine.compile(texts) == 0  # all stored at ingest
    assert compile_index(index, engine, progress=False) == 0
    assert (Path(folder) / "kv").is_dir() and (Path(folder) / "docstore.json").exists()


def test_pipeline_from_documents_and_insert_compile(smol):
    engine = RagPic(Config(store=None, device="cpu"), lm=smol)
    docs = [Document(text="The lighthouse of Alexandria stood on the island of Pharos. " * 3),
            Document(text="Basalt columns form when thick lava cools and contracts slowly. " * 3)]
    splitter = SentenceSplitter(chunk_size=48, chunk_overlap=0)
    nodes = IngestionPipeline(transformations=[splitter, RagPicIngest(engine)]).run(documents=docs[:1])
    assert nodes and engine.compile([node_text(n) for n in nodes]) == 0

    from llama_index.core.embeddings import MockEmbedding  # an embedding model, not a mock of ragpic

    index = VectorStoreIndex.from_documents(docs[1:], embed_model=MockEmbedding(embed_dim=8),
                                            transformations=[splitter, RagPicIngest(engine)])
    assert engine.compile([node_text(n) for n in index.docstore.docs.values()]) == 0
    index.insert(Document(text="Glass sponges build skeletons of silica in the deep sea. " * 3))
    assert engine.compile([node_text(n) for n in index.docstore.docs.values()]) == 0  # insert compiled it
    fresh = RagPic(Config(store=None, device="cpu"), lm=smol)
    assert compile_index(index, fresh, progress=False) == len(index.docstore.docs)


# ----- queries -------------------------------------------------------------------------------


def test_plain_as_query_engine_links_every_retrieved_node(built, question):
    """No helper at all: ``index.as_query_engine(llm=RagPicLLM(...))`` with the stock synthesizer."""
    _, engine, index = built
    llm = RagPicLLM(engine, max_new_tokens=NEW)
    qe = index.as_query_engine(llm=llm, similarity_top_k=TOP_K)
    engine.store.reset_stats()
    r = qe.query(question["question"])
    g = llm.last_generation
    assert len(r.source_nodes) == TOP_K
    assert (g.chunks_matched, g.chunks_loaded, g.chunks_compiled) == (TOP_K, TOP_K, 0)
    assert _hits(engine) == (TOP_K, 0)
    assert set(current_hints()) == {node_text(n) for n in r.source_nodes}
    assert llm.complete("Say hello.").additional_kwargs["hints"] == 0  # an unrelated prompt ignores them


def test_sync_async_streaming_queries_all_hits(built, question):
    _, engine, index = built
    llm = RagPicLLM(engine, max_new_tokens=NEW)
    q = question["question"]
    answers, gens = {}, {}

    def check(name, text, response):
        # the retrieved nodes' texts reached the LLM as hints, in this mode too
        assert set(llm.last_hints) == {node_text(n) for n in response.source_nodes}, name
        answers[name] = text
        gens[name] = llm.last_generation
        assert len(response.source_nodes) == TOP_K

    engine.store.reset_stats()
    r = make_query_engine(index, llm, similarity_top_k=TOP_K).query(q)
    check("sync", str(r), r)

    r = make_query_engine(index, llm, similarity_top_k=TOP_K, streaming=True).query(q)
    check("stream", "".join(r.response_gen), r)

    async def work():
        r = await make_query_engine(index, llm, similarity_top_k=TOP_K).aquery(q)
        check("async", str(r), r)
        r = await make_query_engine(index, llm, similarity_top_k=TOP_K, streaming=True).aquery(q)
        check("astream", "".join([d async for d in r.async_response_gen()]), r)

    _, ticks = asyncio.run(run_with_ticker(work, interval=0.02))
    assert ticks > 20, "the event loop was blocked during generation"
    assert len(set(answers.values())) == 1 and answers["sync"].strip(), answers
    for name, g in gens.items():
        assert (g.chunks_matched, g.chunks_loaded, g.chunks_compiled) == (TOP_K, TOP_K, 0), name
        assert g.method == "fast" and g.recomputed_tokens < g.prompt_tokens / 2
    assert _hits(engine) == (4 * TOP_K, 0)


def test_k_covering_every_chunk_equals_full(built, question):
    _, engine, index = built
    out = {}
    for method in ("legolink-100000", "full"):
        llm = RagPicLLM(engine, max_new_tokens=NEW, method=method)
        engine.store.reset_stats()
        out[method] = str(make_query_engine(index, llm, similarity_top_k=TOP_K).query(question["question"]))
        g = llm.last_generation
        # every row computed but the template's head, which a linked method may take from the
        # prefix cache (full's rows for it, kept by an earlier query): it counts as cached
        assert g.recomputed_tokens + g.cached_tokens == g.prompt_tokens
        assert g.cached_tokens == 0 if method == "full" else g.cached_tokens < g.prompt_tokens // 4
        assert g.chunks_loaded == (TOP_K if method != "full" else 0)
    assert out["legolink-100000"] == out["full"]


def test_reordered_and_repeated_nodes(built, question):
    _, engine, index = built
    out = {}
    for method in ("legolink-100000", "full"):
        llm = RagPicLLM(engine, max_new_tokens=NEW, method=method)
        qe = make_query_engine(index, llm, similarity_top_k=TOP_K, node_postprocessors=[Reverse(), DuplicateFirst()])
        engine.store.reset_stats()
        r = qe.query(question["question"])
        out[method] = str(r)
        g = llm.last_generation
        assert len(r.source_nodes) == TOP_K + 1
        assert g.chunks_matched == TOP_K + 1  # the repeated node matches twice
        if method != "full":
            assert (g.chunks_loaded, g.chunks_compiled) == (TOP_K, 0)
            assert _hits(engine) == (TOP_K, 0)
    assert out["legolink-100000"] == out["full"]


def test_edited_node_is_not_linked_with_its_old_kv(built, question):
    _, engine, index = built
    llm = RagPicLLM(engine, max_new_tokens=NEW)
    qe = make_query_engine(index, llm, similarity_top_k=TOP_K)
    first = qe.retrieve(question["question"])[0].node
    old_text = first.text
    old_prompt_text = node_text(first)
    first.set_content(old_text.replace(" ", "  ", 1) + " (edited)")
    index.docstore.add_documents([first], allow_update=True)
    try:
        engine.store.reset_stats()
        r = qe.query(question["question"])
        g = llm.last_generation
        assert old_prompt_text not in {node_text(n) for n in r.source_nodes}
        assert (g.chunks_matched, g.chunks_loaded, g.chunks_compiled) == (TOP_K, TOP_K - 1, 1)
        assert _hits(engine) == (TOP_K - 1, 1)
    finally:
        first.set_content(old_text)
        index.docstore.add_documents([first], allow_update=True)
