"""Documents in order through LangChain (docs/ARCHITECTURE.md §1.3): ``compile_documents``
compiles each source's chunks behind the chunks before them, ``document_order`` puts retrieved
chunks back in their documents' order, and ``qa_head`` gives the Config under which they read
the chain's own prompt start; the chain then links those entries. The last test runs on the
shared real SmolLM2."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("langchain_core")

from langchain_core.documents import Document  # noqa: E402
from langchain_core.embeddings import DeterministicFakeEmbedding  # noqa: E402  (an embedding model, not a mock of ragpic)
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate  # noqa: E402
from langchain_core.runnables import RunnableLambda, RunnablePassthrough  # noqa: E402
from langchain_core.vectorstores import InMemoryVectorStore  # noqa: E402

from langchain_helpers import CHAT_PROMPT, PROMPT, format_docs  # noqa: E402
from ragpic import Config, RagPic  # noqa: E402
from ragpic.errors import ConfigError  # noqa: E402
from ragpic.llm.langchain import ChatRagPic  # noqa: E402
from ragpic.retriever_hooks.langchain import (  # noqa: E402
    add_documents_with_kv,
    compile_vectorstore,
    document_order,
    document_runs,
    qa_head,
    with_neighbours,
)


def _chunks(source: str, sentences: list[str], per: int = 2) -> list[Document]:
    """A document cut every ``per`` sentences, as a splitter with ``add_start_index=True`` cuts it."""
    text, out = " ".join(sentences), []
    for i in range(0, len(sentences), per):
        piece = " ".join(sentences[i:i + per])
        out.append(Document(page_content=piece, metadata={"source": source, "start_index": text.index(piece)}))
    return out


LOG = _chunks("log.txt", [f"The lighthouse keeper wrote entry {i}: the lamp burned {i + 3} hours tonight."
                          for i in range(10)])
ROCKS = _chunks("rocks.txt", [f"Basalt column {i} formed when lava cooled over {i + 2} weeks." for i in range(6)])
NOTE = _chunks("note.txt", ["The supply boat comes to the point every second Tuesday of the month.",
                             "It brings oil for the lamp, flour, salt and the letters from home."])  # one chunk


def test_document_order_regroups_retrieved_chunks():
    docs = LOG + ROCKS + [Document(page_content="no source"), Document(page_content="no start", metadata={"source": "x"})]
    shuffled = docs[:]
    random.Random(0).shuffle(shuffled)
    out = document_order(shuffled)
    assert sorted(map(id, out)) == sorted(map(id, docs))
    sources = [d.metadata.get("source") or id(d) for d in out]
    assert sources == sorted(sources, key=sources.index)  # each source's chunks together
    assert (out[0].metadata.get("source") or id(out[0])) == (shuffled[0].metadata.get("source") or id(shuffled[0]))
    assert [d for d in out if d.metadata.get("source") == "log.txt"] == LOG
    assert [len(r) for r in document_runs(LOG + ROCKS)] == [len(LOG), len(ROCKS)]
    # chunks without a source are each their own document, in the order they came
    assert document_runs([Document(page_content="a"), Document(page_content="b")])[1][0].page_content == "b"


def _copy(doc: Document) -> Document:
    """What a vector store returns: the chunk's text and metadata in a new object."""
    return Document(page_content=doc.page_content, metadata=dict(doc.metadata))


def test_with_neighbours_adds_the_run_around_each_hit():
    def retrieving(*hits):  # a retriever's answer: new objects with the chunks' text and metadata
        return with_neighbours(RunnableLambda(lambda query: [_copy(h) for h in hits]), LOG + ROCKS, n=2)

    assert retrieving(LOG[2]).invoke("q") == LOG[0:5]
    assert retrieving(LOG[0]).invoke("q") == LOG[0:3]  # clipped at the document's ends
    assert retrieving(ROCKS[-1]).invoke("q") == ROCKS[-3:]
    # two hits whose runs meet: each chunk once; then the next hit's run
    assert retrieving(LOG[4], LOG[3], ROCKS[0]).invoke("q") == LOG[2:7] + LOG[1:2] + ROCKS[0:3]
    assert document_order(retrieving(LOG[4], ROCKS[1]).invoke("q")) == LOG[2:7] + ROCKS[0:4]
    # a hit whose text is not the ingested chunk's, or without a place, comes alone
    stale = Document(page_content="edited", metadata=dict(LOG[4].metadata))
    loose = Document(page_content="no place")
    assert retrieving(stale, loose).invoke("q") == [stale, loose]
    assert with_neighbours(RunnableLambda(lambda q: [_copy(LOG[3])]), LOG, n=0).invoke("q") == LOG[3:4]
    for bad, match in [({"n": -1}, "n must be how many chunks"), ({"n": True}, "n must be"),
                       ({"chunks": ["text"]}, r"chunks\[0\] is a str"),
                       ({"retriever": "store"}, "retriever must be a LangChain retriever")]:
        with pytest.raises(ConfigError, match=match):
            with_neighbours(**{"retriever": RunnableLambda(lambda q: []), "chunks": LOG, **bad})


def test_qa_head_reads_the_prompt_or_says_what_it_needs():
    assert qa_head(CHAT_PROMPT) == {"system_prompt": "Answer the question using the context. Be brief.",
                                    "compile_head": "Context:\n"}
    # a string prompt brings no system message: Config.system_prompt stays the user's
    assert qa_head(PROMPT) == {"compile_head": "Answer the question using the context.\n\nContext:\n"}
    for bad, kwargs, match in [
        (PROMPT, {"context_key": "docs"}, "context_key='docs' is not one of"),
        (PromptTemplate.from_template("{context}\nQ: {question}"), {}, "nothing before"),
        (ChatPromptTemplate.from_messages([("system", "Docs: {context}"), ("human", "{question}")]), {},
         "first user message"),
        ("Context: {context}", {}, "prompt must be a LangChain prompt template"),
    ]:
        with pytest.raises(ConfigError, match=match):
            qa_head(bad, **kwargs)


@pytest.mark.integration
def test_a_chain_in_document_order_links_every_chunk_behind(smol):
    """``retriever | document_order | format_docs`` under ``Config(**qa_head(CHAT_PROMPT))``:
    every chunk (each document's first too) links its entry behind the prompt's start and the
    chunks before it; without document_order, in retrieval order, few do."""
    engine = RagPic(Config(store=None, device="cpu", compile_behind=2, max_new_tokens=4, **qa_head(CHAT_PROMPT)),
                    lm=smol)
    docs = LOG + ROCKS + NOTE  # a source of one chunk too: it reads the prompt's start alone
    store = InMemoryVectorStore(DeterministicFakeEmbedding(size=16))
    add_documents_with_kv(store, docs, engine)
    retriever = store.as_retriever(search_kwargs={"k": len(docs)})
    llm = ChatRagPic(engine=engine)

    def ask(order):
        chain = {"context": retriever | order | format_docs, "question": RunnablePassthrough()} | CHAT_PROMPT | llm
        return chain.with_config(callbacks=[llm.hints]).invoke("How long did the lamp burn after entry 5?")

    meta = ask(document_order).response_metadata
    assert (meta["chunks_matched"], meta["chunks_behind"], meta["chunks_compiled"]) == (len(docs), len(docs), 0)
    meta = ask(lambda found: found).response_metadata  # retrieval's order: only the head-alone entries fit
    assert meta["chunks_matched"] == len(docs) and meta["chunks_behind"] < len(docs)
    # a store filled without ragpic: compile_vectorstore catches up, each chunk alone and behind
    fresh = RagPic(Config(store=None, device="cpu", compile_behind=2, **qa_head(CHAT_PROMPT)), lm=smol)
    assert compile_vectorstore(store, fresh, progress=False) == 2 * len(docs)
    assert compile_vectorstore(store, fresh, progress=False) == 0
    # another format_docs: the separator it puts between documents is what ingest compiles behind
    lines = RagPic(Config(store=None, device="cpu", compile_behind=2, max_new_tokens=4, **qa_head(CHAT_PROMPT)),
                   lm=smol)
    add_documents_with_kv(InMemoryVectorStore(DeterministicFakeEmbedding(size=16)), docs, lines, separator="\n")
    llm = ChatRagPic(engine=lines)
    chain = {"context": retriever | document_order | (lambda found: "\n".join(d.page_content for d in found)),
             "question": RunnablePassthrough()} | CHAT_PROMPT | llm
    meta = chain.invoke("How long did the lamp burn after entry 5?").response_metadata
    assert (meta["chunks_matched"], meta["chunks_behind"]) == (len(docs), len(docs))


def test_one_hit_with_its_neighbours_links_them_behind_one_another(smol):
    """``with_neighbours(retriever, chunks, 2) | document_order``: one retrieved chunk becomes the
    run around it, and each chunk of the run with its compile context before it in the prompt
    (the chain's leading text and two chunks, fewer at the document's start) links that entry."""
    engine = RagPic(Config(store=None, device="cpu", compile_behind=2, max_new_tokens=4, **qa_head(CHAT_PROMPT)),
                    lm=smol)
    store = InMemoryVectorStore(DeterministicFakeEmbedding(size=16))
    add_documents_with_kv(store, LOG + ROCKS, engine)
    llm = ChatRagPic(engine=engine)
    seen = []
    retriever = with_neighbours(store.as_retriever(search_kwargs={"k": 1}), LOG + ROCKS, 2)
    context = retriever | document_order | (lambda found: seen.append(found) or format_docs(found))
    chain = {"context": context, "question": RunnablePassthrough()} | CHAT_PROMPT | llm
    meta = chain.with_config(callbacks=[llm.hints]).invoke("How long did the lamp burn after entry 5?").response_metadata
    [run] = seen
    source = next(r for r in (LOG, ROCKS) if r[0].metadata["source"] == run[0].metadata["source"])
    places = [source.index(next(c for c in source if c.page_content == d.page_content)) for d in run]
    assert len(run) >= 3 and places == list(range(places[0], places[0] + len(run)))
    behind = sum(j - places[0] >= min(2, j) for j in places)  # what each was compiled behind is before it
    assert (meta["chunks_matched"], meta["chunks_behind"], meta["chunks_compiled"]) == (len(run), behind, 0)
