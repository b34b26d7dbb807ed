"""LangChain integration: LCEL RAG chains over FAISS with SmolLM2 and MiniLM, no mocks.

The shared engine links with ``legolink-100000`` (k covers every chunk, so every chunk token
is recomputed): its answers must equal ``full`` prefill's, while the KV still comes from the
store (proven by the store's counters and the chunks loaded per call).

"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loop_probe import run_with_ticker

pytest.importorskip("langchain_core")
pytest.importorskip("langchain_community")
pytest.importorskip("faiss")

from langchain_core.callbacks import BaseCallbackHandler  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.embeddings import Embeddings  # noqa: E402
from langchain_core.output_parsers import StrOutputParser  # noqa: E402
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate  # noqa: E402
from langchain_core.runnables import RunnablePassthrough  # noqa: E402

from ragpic.config import Config  # noqa: E402
from ragpic.engine import RagPic  # noqa: E402
from ragpic.llm.langchain import ChatRagPic, RagPicLLM  # noqa: E402
from ragpic.retriever_hooks.langchain import (  # noqa: E402
    add_documents_with_kv,
    compile_vectorstore,
    faiss_from_documents,
    kv_path,
    messages_key,
    prompt_key,
)

pytestmark = pytest.mark.integration

K = 3  # retrieved documents per question
NEW_TOKENS = 20
EXACT = "legolink-100000"  # recomputes every chunk token: must equal `full`

PROMPT = PromptTemplate.from_template(
    "Answer the question using the context.\n\nContext:\n{context}\n\nQuestion: {question}\nAnswer:")
CHAT_PROMPT = ChatPromptTemplate.from_messages([
    ("system", "Answer the question using the context. Be brief."),
    ("human", "Context:\n{context}\n\nQuestion: {question}"),
])


class MiniLM(Embeddings):
    """all-MiniLM-L6-v2 from a local folder, through sentence-transformers."""

    def __init__(self, path: str):
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(path, device="cpu")

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.model.encode(list(texts), normalize_embeddings=True).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


def format_docs(docs: list[Document]) -> str:
    return "\n\n".join(d.page_content for d in docs)


def rag_chain(retriever, llm, prompt=PROMPT):
    """The standard LCEL RAG chain."""
    return {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt | llm | StrOutputParser()


def model_for(rag: dict, kind: str):
    """The completion LLM (``kind="llm"``) or chat model over the shared engine, and its prompt."""
    cls, prompt = (RagPicLLM, PROMPT) if kind == "llm" else (ChatRagPic, CHAT_PROMPT)
    return cls(engine=rag["engine"]), prompt


def recorded_chain(rag: dict, kind: str):
    """``(llm, recorder, chain)``: the RAG chain with the hints handler and a recorder wired in."""
    llm, prompt = model_for(rag, kind)
    rec = Recorder()
    return llm, rec, rag_chain(rag["retriever"], llm, prompt).with_config(callbacks=[llm.hints, rec])


def passages(item: dict, words: int | None = 120) -> list[Document]:
    return [Document(page_content=f"{c['title']}\n{' '.join(c['text'].split()[:words])}",
                     metadata={"title": c["title"]}) for c in item["ctxs"]]


class Recorder(BaseCallbackHandler):
    """Collects each model call's ragpic stats, streamed tokens, and the hints it was given."""

    def __init__(self, hints=None):
        self.hints = hints
        self.infos: list[dict] = []
        self.tokens: list[str] = []
        self.hinted: list[list[str]] = []
        self.ended_at: list[float] = []
        self._prompts: dict = {}

    def on_llm_start(self, serialized, prompts, *, run_id, **kwargs):
        self._prompts[run_id] = prompt_key(prompts[0])

    def on_chat_model_start(self, serialized, messages, *, run_id, **kwargs):
        self._prompts[run_id] = messages_key(messages[0])

    def on_llm_new_token(self, token, **kwargs):
        if token:
            self.tokens.append(token)

    def on_llm_end(self, response, *, run_id, **kwargs):
        gen = response.generations[0][0]
        info = gen.generation_info or getattr(getattr(gen, "message", None), "response_metadata", {})
        self.infos.append(dict(info))
        self.ended_at.append(time.perf_counter())
        if self.hints is not None and run_id in self._prompts:
            self.hinted.append(self.hints.texts_for(self._prompts.pop(run_id)))


@pytest.fixture(scope="module")
def embeddings(embed_model_path):
    return MiniLM(embed_model_path)


@pytest.fixture(scope="module")
def rag(smol, musique, embeddings, tmp_path_factory):
    """FAISS over 10 MuSiQue passages (120 words) saved to a folder, KV in ``folder/kv``."""
    folder = tmp_path_factory.mktemp("faiss")
    engine = RagPic(Config(store=kv_path(folder), method=EXACT, max_new_tokens=NEW_TOKENS), lm=smol)
    docs = passages(musique[0])
    store = faiss_from_documents(docs[:7], embeddings, engine)
    assert engine.store.stats().puts == 7
    add_documents_with_kv(store, docs[7:], engine)
    assert engine.store.stats().puts == 10
    assert compile_vectorstore(store, engine, progress=False) == 0  # all there already
    store.save_local(str(folder))
    questions = [musique[i]["question"] for i in range(3)]
    return {"engine": engine, "store": store, "folder": folder, "docs": docs, "questions": questions,
            "retriever": store.as_retriever(search_kwargs={"k": K})}


def _check_linked(rec: Recorder, n: int, hints: int = K) -> None:
    """``n`` model calls, each linking K stored chunks, given ``hints`` retrieved texts."""
    assert len(rec.infos) == n
    for info in rec.infos:
        assert info["chunks_matched"] == K and info["chunks_loaded"] == K, info
        assert info["chunks_compiled"] == 0, info
        assert info["hints"] == hints, info


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
    _check_linked(rec, len(qs))
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
    _check_linked(rec, 1)
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
    _check_linked(rec_hinted, 1)
    _check_linked(rec, 1, hints=0)  # the store's catalog was searched instead


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
    _check_linked(rec, 2)


@pytest.mark.parametrize("kind", ["llm", "chat"])
def test_batch_equals_invoke(rag, kind):
    llm, rec, chain = recorded_chain(rag, kind)
    qs = rag["questions"]
    batched = chain.batch(qs)
    _check_linked(rec, len(qs))
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
    _check_linked(rec, 3)


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


RELOAD = """
import json, sys
sys.path.insert(0, {tests!r})
from langchain_core.callbacks import BaseCallbackHandler
from ragpic.config import Config
from ragpic.engine import RagPic
from ragpic.llm.langchain import RagPicLLM
from ragpic.core.model import load_model
from ragpic.retriever_hooks.langchain import compile_vectorstore, kv_path, load_faiss
from test_langchain import EXACT, K, NEW_TOKENS, MiniLM, Recorder, rag_chain

folder = {folder!r}
engine = RagPic(Config(store=kv_path(folder), method=EXACT, max_new_tokens=NEW_TOKENS),
                lm=load_model(device="cpu"))
store = load_faiss(folder, MiniLM({embed!r}), engine)   # compiles whatever is missing
compiled = compile_vectorstore(store, engine, progress=False)
llm = RagPicLLM(engine=engine)
rec = Recorder()
chain = rag_chain(store.as_retriever(search_kwargs={{"k": K}}), llm).with_config(callbacks=[llm.hints, rec])
answer = chain.invoke({question!r})
s = engine.store.stats()
print("RESULT " + json.dumps({{"answer": answer, "compiled": compiled, "info": rec.infos[0],
      "misses": s.misses, "backend_hits": s.backend_hits, "puts": s.puts}}))
"""


def test_reload_in_fresh_process_compiles_nothing(rag, embed_model_path):
    q = rag["questions"][0]
    llm = RagPicLLM(engine=rag["engine"])
    expected = rag_chain(rag["retriever"], llm).with_config(callbacks=[llm.hints]).invoke(q)
    script = RELOAD.format(tests=str(Path(__file__).parent), folder=str(rag["folder"]),
                           embed=embed_model_path, question=q)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         timeout=600, cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    res = json.loads(line.removeprefix("RESULT "))
    assert res["compiled"] == 0 and res["puts"] == 0, res
    assert res["misses"] == 0 and res["backend_hits"] == K, res
    assert res["info"]["chunks_loaded"] == K and res["info"]["chunks_compiled"] == 0, res
    assert res["info"]["hints"] == K, res
    assert res["answer"] == expected
