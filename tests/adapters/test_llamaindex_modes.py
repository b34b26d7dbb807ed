"""Every response mode make_query_engine accepts, and plain ``index.as_query_engine``: each LLM
prompt holds whole node texts, each linked from the store (SmolLM2 + MiniLM + FAISS)."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_index.core")
pytest.importorskip("llama_index.vector_stores.faiss")

from llama_index.core.instrumentation import get_dispatcher  # noqa: E402
from llama_index.core.instrumentation.event_handlers import BaseEventHandler  # noqa: E402
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent  # noqa: E402

from ragpic.errors import ConfigError  # noqa: E402
from ragpic.llm.llamaindex import RagPicLLM, make_query_engine  # noqa: E402
from ragpic.llm.llamaindex.query_engine import WHOLE_NODE_MODES  # noqa: E402
from ragpic.retriever_hooks.llamaindex import node_text  # noqa: E402

pytestmark = pytest.mark.integration

TOP_K = 4
NEW = 8


class _Calls(BaseEventHandler):
    """Records ragpic's statistics of every LLM call LlamaIndex makes (its own instrumentation)."""

    calls: list = []

    @classmethod
    def class_name(cls) -> str:
        return "RecordRagPicCalls"

    def handle(self, event, **kwargs) -> None:
        if isinstance(event, LLMChatEndEvent) and event.response is not None:
            self.calls.append(dict(event.response.additional_kwargs))


@pytest.fixture
def calls():
    handler = _Calls(calls=[])
    dispatcher = get_dispatcher()
    dispatcher.add_event_handler(handler)
    try:
        yield handler.calls
    finally:
        dispatcher.event_handlers.remove(handler)


def _all_linked(calls: list[dict]) -> tuple[int, int]:
    """``(chunks in all prompts, LLM calls)`` after checking every chunk of every prompt came
    from the store and nothing was compiled."""
    for c in calls:
        assert c["chunks_loaded"] == c["chunks_matched"] and c["chunks_compiled"] == 0, c
    return sum(c["chunks_matched"] for c in calls), len(calls)


def _small_window(llm_for, index, question) -> int:
    """A context window that holds the template and about two of the retrieved nodes."""
    nodes = index.as_retriever(similarity_top_k=TOP_K).retrieve(question["question"])
    sizes = sorted(len(llm_for.token_ids(node_text(n))) for n in nodes)
    return 260 + sizes[-1] + sizes[-2] + NEW


@pytest.mark.parametrize("mode", WHOLE_NODE_MODES)
def test_every_accepted_mode_links_every_retrieved_node(built, question, calls, mode):
    _, engine, index = built
    llm = RagPicLLM(engine, max_new_tokens=NEW)
    r = make_query_engine(index, llm, response_mode=mode, similarity_top_k=TOP_K).query(question["question"])
    chunks, n_calls = _all_linked(calls)
    assert len(r.source_nodes) == TOP_K and chunks == TOP_K, (mode, calls)
    expected_calls = {"refine": TOP_K, "accumulate": TOP_K}.get(mode, 1)
    assert n_calls == expected_calls, (mode, n_calls)


@pytest.mark.parametrize("mode", ["tree_summarize", "refine", "compact_accumulate"])
def test_modes_past_the_window_pack_whole_nodes_into_several_prompts(built, question, calls, mode):
    _, engine, index = built
    llm = RagPicLLM(engine, max_new_tokens=NEW)
    llm = RagPicLLM(engine, max_new_tokens=NEW, context_window=_small_window(llm, index, question))
    make_query_engine(index, llm, response_mode=mode, similarity_top_k=TOP_K).query(question["question"])
    chunks, n_calls = _all_linked(calls)
    with_chunks = [c for c in calls if c["chunks_matched"]]
    assert len(with_chunks) >= 2 and chunks == TOP_K, (mode, calls)  # each node in one prompt, whole


@pytest.mark.parametrize("mode", ["compact", "tree_summarize"])
def test_plain_as_query_engine_links_in_compact_and_tree_summarize(built, question, calls, mode):
    _, engine, index = built
    llm = RagPicLLM(engine, max_new_tokens=NEW)
    index.as_query_engine(llm=llm, response_mode=mode, similarity_top_k=TOP_K).query(question["question"])
    chunks, n_calls = _all_linked(calls)
    assert (chunks, n_calls) == (TOP_K, 1)
    assert calls[0]["hints"] == calls[0]["hints_found"] == TOP_K


@pytest.mark.parametrize("mode,message", [
    ("simple_summarize", "use 'compact', the same single prompt with whole nodes"),
    ("no_text", "use index.as_retriever"),
    ("magic", "unknown response_mode 'magic'"),
])
def test_modes_that_cannot_keep_nodes_whole_are_refused(built, mode, message):
    _, engine, index = built
    with pytest.raises(ConfigError, match=message):
        make_query_engine(index, RagPicLLM(engine, max_new_tokens=NEW), response_mode=mode)


def test_a_postprocessor_that_edits_node_text_is_a_logged_miss(built, question, calls, caplog):
    import logging

    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.schema import NodeWithScore

    class Rerank(BaseNodePostprocessor):  # edits metadata after retrieval: the stored KV no longer fits
        def _postprocess_nodes(self, nodes, query_bundle=None):
            edited = nodes[0].node.model_copy(deep=True)  # a copy: the shared index stays as built
            edited.metadata["rank"] = 99
            return [NodeWithScore(node=edited, score=nodes[0].score), *nodes[1:]]

    _, engine, index = built
    llm = RagPicLLM(engine, max_new_tokens=NEW)
    qe = make_query_engine(index, llm, similarity_top_k=TOP_K, node_postprocessors=[Rerank()])
    with caplog.at_level(logging.WARNING, logger="ragpic.engine"):
        qe.query(question["question"])
    assert calls[0]["hints"] == TOP_K and calls[0]["hints_found"] == TOP_K - 1
    # the three intact nodes link; the edited one is computed as text, never linked with stale KV
    assert (calls[0]["chunks_matched"], calls[0]["chunks_loaded"]) == (TOP_K - 1, TOP_K - 1)
    assert any("1 of 4 retrieval hints are in the prompt only in part" in r.message for r in caplog.records)
