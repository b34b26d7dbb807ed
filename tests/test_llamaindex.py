"""LlamaIndex end to end: SmolLM2 + MiniLM + FAISS over MuSiQue passages, real LlamaIndex objects.

Run: OMP_NUM_THREADS=1 .venv/bin/pytest tests/test_llamaindex.py -m integration
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
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

from ragpic.config import Config  # noqa: E402
from ragpic.engine import RagPic  # noqa: E402
from ragpic.llm.llamaindex import ContextOverflowError, RagPicLLM, RagPicSynthesizer, make_query_engine  # noqa: E402
from ragpic.retriever_hooks.llamaindex import (  # noqa: E402
    RagPicIngest,
    build_faiss_index,
    compile_index,
    current_hints,
    kv_folder,
    node_text,
    retrieval_hints,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
TOP_K = 4
NEW = 16


# ----- fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embed(embed_model_path):
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    return HuggingFaceEmbedding(model_name=embed_model_path, device="cpu")


@pytest.fixture(scope="module")
def question(musique) -> dict:
    return next(q for q in musique if len(q["ctxs"]) >= 9)


def _documents(question: dict) -> list[Document]:
    """9 passages cut to 120 words, with LLM-visible metadata (and one hidden key)."""
    docs = []
    for i, c in enumerate(question["ctxs"][:9]):
        text = " ".join(c["text"].split()[:120])
        docs.append(Document(text=text, metadata={"title": c.get("title") or f"passage {i}", "rank": i,
                                                  "internal_id": f"id-{i}"},
                             excluded_llm_metadata_keys=["internal_id"]))
    return docs


@pytest.fixture(scope="module")
def built(tmp_path_factory, smol, embed, question):
    """A persisted FAISS index over 9 passages with their KV in ``folder/kv``."""
    folder = tmp_path_factory.mktemp("li_index")
    engine = RagPic(Config(store=kv_folder(folder), device="cpu"), lm=smol)
    index = build_faiss_index(_documents(question), engine, embed_model=embed, transformations=[], folder=folder)
    return folder, engine, index


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
        assert g.method == "legolink-16" and g.recomputed_tokens < g.prompt_tokens / 2
    assert _hits(engine) == (4 * TOP_K, 0)
    built[0].joinpath("answer.json").write_text(json.dumps({"q": q, "answer": answers["sync"]}))


def test_k_covering_every_chunk_equals_full(built, question):
    _, engine, index = built
    out = {}
    for method in ("legolink-100000", "full"):
        llm = RagPicLLM(engine, max_new_tokens=NEW, method=method)
        engine.store.reset_stats()
        out[method] = str(make_query_engine(index, llm, similarity_top_k=TOP_K).query(question["question"]))
        g = llm.last_generation
        assert g.recomputed_tokens == g.prompt_tokens
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


def test_prompt_without_cached_chunks_complete_chat_stream(built):
    _, engine, _ = built
    llm = RagPicLLM(engine, max_new_tokens=NEW)
    prompt = "Name the largest planet of the solar system."
    r = llm.complete(prompt)
    assert r.text.strip() and prompt not in r.text  # no echo
    assert r.additional_kwargs["chunks_matched"] == 0 and r.additional_kwargs["ttft_s"] > 0
    assert r.additional_kwargs["hints"] == 0
    full = RagPicLLM(engine, max_new_tokens=NEW, method="full").complete(prompt)
    assert full.text == r.text
    assert "".join(c.delta for c in llm.stream_complete(prompt)) == r.text

    from llama_index.core.llms import ChatMessage

    msgs = [ChatMessage(role="user", content=prompt)]
    assert llm.chat(msgs).message.content == r.text
    chunks = list(llm.stream_chat(msgs))
    assert "".join(c.delta for c in chunks) == r.text and chunks[-1].message.content == r.text

    async def run():
        a = await llm.acomplete(prompt)
        s = "".join([c.delta async for c in await llm.astream_chat(msgs)])
        return a.text, s

    assert asyncio.run(run()) == (r.text, r.text)
    m = llm.metadata
    assert (m.context_window, m.num_output, m.is_chat_model) == (engine.context_window, NEW, True)


def test_manual_hints_outside_a_query_engine(built, question):
    _, engine, index = built
    llm = RagPicLLM(engine, max_new_tokens=4)
    nodes = index.as_retriever(similarity_top_k=2).retrieve(question["question"])
    prompt = "Context:\n" + "\n\n".join(node_text(n) for n in nodes) + "\nQuestion: " + question["question"]
    with retrieval_hints(nodes):
        g = llm.complete(prompt).additional_kwargs
    assert (g["hints"], g["chunks_matched"], g["chunks_loaded"], g["chunks_compiled"]) == (2, 2, 2, 0)
    assert llm.complete(prompt, hints=[node_text(nodes[0])]).additional_kwargs["hints"] == 1


def test_overflow_drops_lowest_scored_whole_nodes_or_fails(built, question, smol):
    from llama_index.core.indices.prompt_helper import PromptHelper

    _, engine, index = built
    llm = RagPicLLM(engine, max_new_tokens=NEW)
    nodes = index.as_retriever(similarity_top_k=6).retrieve(question["question"])
    sizes = [len(llm.token_ids(node_text(n))) for n in nodes]
    small = PromptHelper(context_window=200 + sum(sizes[:3]) + 10 * 3 + NEW, num_output=NEW,
                         tokenizer=llm.token_ids)
    synth = RagPicSynthesizer(llm, prompt_helper=small)
    kept = synth.fit_nodes(question["question"], list(reversed(nodes)))
    assert 1 <= len(kept) < len(nodes)
    kept_ids = [n.node.node_id for n in kept]
    assert kept_ids == [n.node.node_id for n in reversed(nodes) if n.node.node_id in kept_ids]  # order kept
    assert min(n.score for n in kept) >= max(n.score for n in nodes if n.node.node_id not in kept_ids)
    assert synth._make_compact_text_chunks(question["question"], [node_text(n) for n in kept]) == [
        "\n\n".join(node_text(n) for n in kept)]  # one prompt, texts intact
    with pytest.raises(ContextOverflowError, match="retrieve fewer"):
        RagPicSynthesizer(llm, prompt_helper=small, on_overflow="error").fit_nodes(question["question"], nodes)
    with pytest.raises(ContextOverflowError, match="context window"):
        llm.complete("word " * (engine.context_window + 10))


# ----- persistence -----------------------------------------------------------------------------

_RELOAD = textwrap.dedent("""
    import json, sys
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding
    from ragpic.config import Config
    from ragpic.engine import RagPic
    from ragpic.llm.llamaindex import RagPicLLM, make_query_engine
    from ragpic.retriever_hooks.llamaindex import kv_folder, load_faiss_index

    folder, embed_path, question = sys.argv[1:4]
    engine = RagPic(Config(store=kv_folder(folder), device="cpu"))
    index = load_faiss_index(folder, embed_model=HuggingFaceEmbedding(model_name=embed_path, device="cpu"))
    llm = RagPicLLM(engine, max_new_tokens={new})
    r = make_query_engine(index, llm, similarity_top_k={k}).query(question)
    g, s = llm.last_generation, engine.store.stats()
    print(json.dumps({{"answer": str(r), "compiled": g.chunks_compiled, "loaded": g.chunks_loaded,
                      "backend_hits": s.backend_hits, "misses": s.misses, "puts": s.puts}}))
""").format(new=NEW, k=TOP_K)


def test_reload_in_a_new_process_links_without_compiling(built, question, embed_model_path):
    folder, _, _ = built
    saved = folder / "answer.json"
    if not saved.exists():
        pytest.skip("needs test_sync_async_streaming_queries_all_hits to have run first")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _RELOAD, str(folder), embed_model_path, question["question"]],
                          capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["compiled"] == 0 and out["puts"] == 0 and out["misses"] == 0
    assert out["loaded"] == TOP_K and out["backend_hits"] == TOP_K
    assert out["answer"] == json.loads(saved.read_text())["answer"]
