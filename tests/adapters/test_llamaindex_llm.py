"""LlamaIndex LLM calls outside query engines: plain prompts, manual hints, overflow, reload in a
new process, and the class's construction rules. Shares the index fixture ``built`` (conftest.py).
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

pytest.importorskip("llama_index.core")
pytest.importorskip("llama_index.vector_stores.faiss")
pytest.importorskip("llama_index.embeddings.huggingface")

from llama_index.core.instrumentation import get_dispatcher  # noqa: E402

from ragpic.errors import ConfigError, ContextOverflowError  # noqa: E402
from ragpic.llm.llamaindex import RagPicLLM, RagPicSynthesizer, make_query_engine  # noqa: E402
from ragpic.retriever_hooks.llamaindex import node_text, retrieval_hints  # noqa: E402

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOP_K = 4
NEW = 16


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
    from ragpic import Config, RagPic, kv_folder
    from ragpic.llm.llamaindex import RagPicLLM, make_query_engine
    from ragpic.retriever_hooks.llamaindex import load_faiss_index

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
    folder, engine, index = built
    expected = str(make_query_engine(index, RagPicLLM(engine, max_new_tokens=NEW),
                                     similarity_top_k=TOP_K).query(question["question"]))
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _RELOAD, str(folder), embed_model_path, question["question"]],
                          capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["compiled"] == 0 and out["puts"] == 0 and out["misses"] == 0
    assert out["loaded"] == TOP_K and out["backend_hits"] == TOP_K
    assert out["answer"] == expected


def test_any_number_of_llms_leave_one_hint_handler_on_the_dispatcher(built):
    _, engine, _ = built
    dispatcher = get_dispatcher()
    before = len(dispatcher.event_handlers)
    llms = [RagPicLLM(engine, max_new_tokens=4) for _ in range(100)]
    handlers = [h for h in dispatcher.event_handlers if type(h).__name__ == "_RetrievalHintHandler"]
    assert len(handlers) == 1 and len(dispatcher.event_handlers) <= before + 1 and len(llms) == 100


def test_no_engine_is_a_clear_error_and_loads_nothing():
    for make in (lambda: RagPicLLM(), lambda: RagPicLLM(engine="smollm2")):
        with pytest.raises(ConfigError, match="RagPicLLM needs engine=.*RagPic"):
            make()
