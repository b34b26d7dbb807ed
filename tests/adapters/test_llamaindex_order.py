"""Documents in order through LlamaIndex (docs/ARCHITECTURE.md §1.3): ``RagPicIngest`` compiles each
document's nodes behind the nodes before them, ``DocumentOrder`` puts retrieved nodes back in
their documents' order, and the query links those entries; on the shared real SmolLM2."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core import Document, VectorStoreIndex  # noqa: E402
from llama_index.core.embeddings import MockEmbedding  # noqa: E402  (an embedding model, not a mock of ragpic)
from llama_index.core.node_parser import SentenceSplitter  # noqa: E402
from llama_index.core.postprocessor.types import BaseNodePostprocessor  # noqa: E402
from llama_index.core.schema import NodeWithScore  # noqa: E402

from ragpic import Config, RagPic  # noqa: E402
from ragpic.llm.llamaindex import RagPicLLM  # noqa: E402
from ragpic.errors import ConfigError  # noqa: E402
from ragpic.retriever_hooks.llamaindex import DocumentOrder, RagPicIngest, compile_index, node_text, qa_head  # noqa: E402

pytestmark = pytest.mark.integration

DOCS = [
    Document(text=" ".join(f"The lighthouse keeper wrote entry {i}: the lamp burned {i + 3} hours tonight."
                           for i in range(12)), doc_id="log"),
    Document(text=" ".join(f"Basalt column {i} formed when lava cooled over {i + 2} weeks."
                           for i in range(8)), doc_id="geology"),
]


class Reverse(BaseNodePostprocessor):
    """Every document's nodes backwards: no node follows the ones it was compiled behind."""

    def _postprocess_nodes(self, nodes, query_bundle=None):
        return list(reversed(nodes))


@pytest.fixture
def indexed(smol):
    engine = RagPic(Config(store=None, device="cpu", compile_behind=2, max_new_tokens=4), lm=smol)
    index = VectorStoreIndex.from_documents(DOCS, embed_model=MockEmbedding(embed_dim=8),
                                            transformations=[SentenceSplitter(chunk_size=40, chunk_overlap=0),
                                                             RagPicIngest(engine)])
    return engine, index


def test_ingest_compiles_each_document_in_order(indexed):
    engine, index = indexed
    nodes = list(index.docstore.docs.values())
    per_doc = {d.doc_id: sum(n.ref_doc_id == d.doc_id for n in nodes) for d in DOCS}
    assert all(n >= 3 for n in per_doc.values())
    texts = [node_text(n) for n in nodes]
    assert engine.compile(texts) == 0  # the plain entries are there
    fresh = RagPic(Config(store=None, device="cpu", compile_behind=2), lm=engine.lm)
    # every node alone, and every node but each document's first behind the ones before it
    assert compile_index(index, fresh, progress=False) == len(nodes) + len(nodes) - len(DOCS)
    assert compile_index(index, fresh, progress=False) == 0


def test_document_order_regroups_retrieved_nodes():
    nodes = SentenceSplitter(chunk_size=40, chunk_overlap=0).get_nodes_from_documents(DOCS)
    scored = [NodeWithScore(node=n, score=float(i)) for i, n in enumerate(nodes)]
    random.Random(0).shuffle(scored)
    out = DocumentOrder().postprocess_nodes(scored)
    assert sorted(id(n) for n in out) == sorted(id(n) for n in scored)  # the same nodes, scores kept
    docs = [n.node.ref_doc_id for n in out]
    assert docs == sorted(docs, key=docs.index)  # each document's nodes together, best document first
    assert docs[0] == scored[0].node.ref_doc_id
    for d in set(docs):
        starts = [n.node.start_char_idx for n in out if n.node.ref_doc_id == d]
        assert starts == sorted(starts)


def test_a_query_in_document_order_links_the_entries_behind(indexed):
    engine, index = indexed
    n = len(index.docstore.docs)
    llm = RagPicLLM(engine, max_new_tokens=4)
    ordered = index.as_query_engine(llm=llm, similarity_top_k=n, node_postprocessors=[DocumentOrder()])
    ordered.query("How many hours did the lamp burn after entry 5?")
    g = llm.last_generation
    # every node but each document's first follows the nodes it was compiled behind
    assert (g.chunks_matched, g.chunks_behind, g.chunks_compiled) == (n, n - len(DOCS), 0)
    backwards = index.as_query_engine(llm=llm, similarity_top_k=n, node_postprocessors=[DocumentOrder(), Reverse()])
    backwards.query("How many hours did the lamp burn after entry 5?")
    g = llm.last_generation
    assert (g.chunks_matched, g.chunks_loaded, g.chunks_behind) == (n, n, 0)  # every node alone


def _query_in_order(engine, docs, method=None):
    index = VectorStoreIndex.from_documents(docs, embed_model=MockEmbedding(embed_dim=8),
                                            transformations=[SentenceSplitter(chunk_size=40, chunk_overlap=0),
                                                             RagPicIngest(engine)])
    llm = RagPicLLM(engine, max_new_tokens=4, method=method)
    n = len(index.docstore.docs)
    index.as_query_engine(llm=llm, similarity_top_k=n, node_postprocessors=[DocumentOrder()]).query(
        "How many hours did the lamp burn after entry 5?")
    return llm.last_generation, n


def test_behind_the_query_engines_own_leading_text_every_node_links_behind(smol):
    """qa_head(): the default text-QA template's system message and the text before its context,
    so each document's nodes (its first too) read the prompt's own start; behind ragpic's chat
    opening instead (compile_head=True) they link nowhere under LlamaIndex's system message."""
    g, n = _query_in_order(RagPic(Config(store=None, device="cpu", compile_behind=2, **qa_head()), lm=smol), DOCS)
    assert (g.chunks_matched, g.chunks_behind, g.chunks_compiled) == (n, n, 0)
    g, n = _query_in_order(RagPic(Config(store=None, device="cpu", compile_behind=2, compile_head=True), lm=smol), DOCS)
    assert (g.chunks_matched, g.chunks_behind) == (n, 0)
    # one document behind all of its nodes before it: every row is full's, so naive answers as full
    engine = RagPic(Config(store=None, device="cpu", compile_behind=16, **qa_head()), lm=smol)
    naive, n = _query_in_order(engine, DOCS[:1], method="naive")
    full, _ = _query_in_order(engine, DOCS[:1], method="full")
    assert naive.chunks_behind == n >= 4 and naive.token_ids == full.token_ids


def test_qa_head_reads_the_template_or_says_what_it_needs():
    from llama_index.core.prompts import ChatMessage, ChatPromptTemplate, PromptTemplate
    from llama_index.core.prompts.chat_prompts import CHAT_TEXT_QA_PROMPT

    head = qa_head()
    system = CHAT_TEXT_QA_PROMPT.message_templates[0].content
    assert head == {"system_prompt": system, "compile_head": "Context information is below.\n---------------------\n"}
    assert qa_head(PromptTemplate("Docs:\n{context_str}\nQ: {query_str}")) == {"system_prompt": None,
                                                                               "compile_head": "Docs:\n"}
    for bad, match in [(PromptTemplate("{context_str}\nQ: {query_str}"), "nothing before"),
                       (PromptTemplate("Q: {query_str}"), "first user message"),
                       (ChatPromptTemplate([ChatMessage(role="system", content="Docs: {context_str}"),
                                            ChatMessage(role="user", content="{query_str}")]), "first user message")]:
        with pytest.raises(ConfigError, match=match):
            qa_head(bad)


class Hit(BaseNodePostprocessor):
    """A retriever's one hit in the middle of a document (``MockEmbedding`` ranks nothing)."""

    node_id: str

    def _postprocess_nodes(self, nodes, query_bundle=None):
        return [n for n in nodes if n.node.node_id == self.node_id]


def test_a_hit_with_its_neighbours_links_them_behind_one_another(smol):
    """PrevNextNodePostprocessor turns one hit into its document's run around it; DocumentOrder
    keeps it in order, and each node of the run with its compile context before it in the
    prompt (two nodes, the leading text) links that entry; the run's first two do not."""
    from llama_index.core.postprocessor import PrevNextNodePostprocessor

    engine = RagPic(Config(store=None, device="cpu", compile_behind=2, max_new_tokens=4, **qa_head()), lm=smol)
    index = VectorStoreIndex.from_documents(DOCS[:1], embed_model=MockEmbedding(embed_dim=8),
                                            transformations=[SentenceSplitter(chunk_size=40, chunk_overlap=0),
                                                             RagPicIngest(engine)])
    nodes = sorted(index.docstore.docs.values(), key=lambda n: n.start_char_idx)
    assert len(nodes) >= 6
    hit = len(nodes) // 2  # a run of five from the second node on, at least
    llm = RagPicLLM(engine, max_new_tokens=4)
    around = PrevNextNodePostprocessor(docstore=index.docstore, num_nodes=2, mode="both")
    query = index.as_query_engine(llm=llm, similarity_top_k=len(nodes),
                                  node_postprocessors=[Hit(node_id=nodes[hit].node_id), around, DocumentOrder()])
    response = query.query("How many hours did the lamp burn after entry 5?")
    assert [n.node.node_id for n in response.source_nodes] == [n.node_id for n in nodes[hit - 2:hit + 3]]
    g = llm.last_generation
    assert (g.chunks_matched, g.chunks_behind, g.chunks_compiled) == (5, 3, 0)
