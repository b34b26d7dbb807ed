"""``ragpic serve`` on the embedded SmolLM2 behind real clients, two workers on one real Redis.

LangChain's ``ChatOpenAI`` in an LCEL RAG chain and LlamaIndex's ``OpenAILike`` in a query
engine get the answers the in-process engine gives for the very messages they sent (greedy),
with ``cached_tokens > 0``, streamed and not; a chunk compiled through one worker is a store
hit on the other (found in the prompt through the shared index, no hints); killing a worker
mid-stream leaves the other serving.
"""

from __future__ import annotations

import json

import httpx
import pytest

from redis_server import redis_server  # noqa: F401 - a fixture
from serve_helpers import Server

pytestmark = [pytest.mark.integration, pytest.mark.redis]

MODEL = "smollm2-135m-instruct"
PASSAGES = [
    "Dolores Park is a city park in the Mission District of San Francisco. On sunny days it fills with "
    "people who bring a sandwich and sit on the grass.",
    "The Golden Gate Bridge is a suspension bridge spanning the Golden Gate, the strait between San "
    "Francisco Bay and the Pacific Ocean.",
    "Alcatraz Island lies in San Francisco Bay. It held a federal prison from 1934 to 1963 and is now a "
    "museum reached by ferry.",
]
QUESTION = "What do people do in Dolores Park?"


@pytest.fixture(scope="module")
def workers(redis_server, tmp_path_factory):
    home = tmp_path_factory.mktemp("smol-serve")
    servers = [Server("--store", redis_server.url, "--max-batch", "4", home=home, isolate=False, timeout_s=300)
               for _ in range(2)]
    # The passages are stored before any test runs (through worker 0, so worker 1's hits cross
    # workers): each test then finds them alone, in any order, as the engine fixture does.
    with servers[0].client() as c:
        assert c.post("/v1/context_cache", json={"texts": PASSAGES}).status_code == 200
    yield servers
    for s in servers:
        s.stop()


@pytest.fixture(scope="module")
def engine():
    from ragpic import Config, RagPic

    e = RagPic(Config(store=None))
    e.compile(PASSAGES)
    return e


class Captured:
    """An httpx client that records each JSON body it sends (what the framework asked for)."""

    def __init__(self, cls=httpx.Client):
        self.bodies: list[dict] = []
        self.client = cls(timeout=300, event_hooks={"request": [self._record]})

    def _record(self, request):
        self.bodies.append(json.loads(request.content))


def in_process(engine, body: dict):
    return engine.generate(body["messages"], max_new_tokens=body.get("max_tokens") or body.get("max_completion_tokens"))


def test_context_cache_then_hit_on_the_other_worker(workers):
    a, b = workers
    with a.client() as ca, b.client() as cb:
        r = ca.post("/v1/context_cache", json={"texts": PASSAGES})
        assert r.status_code == 200, r.text
        ids = [d["id"] for d in r.json()["data"]]
        assert cb.get(f"/v1/context_cache/{ids[0]}").json()["text"] == PASSAGES[0]
        prompt = "Answer using the passages.\n\n" + "\n\n".join(PASSAGES) + f"\n\nQuestion: {QUESTION}"
        body = cb.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 8,
                                                     "messages": [{"role": "user", "content": prompt}]}).json()
        stats = body["ragpic"]
        assert stats["hints"] == 0 and stats["chunks_loaded"] == 3 and stats["chunks_compiled"] == 0, stats
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_langchain_chat_openai_in_an_lcel_rag_chain(workers, engine):
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnableLambda, RunnablePassthrough
    from langchain_openai import ChatOpenAI

    cap = Captured()
    llm = ChatOpenAI(base_url=workers[0].url + "/v1", api_key="unused", model=MODEL, temperature=0, max_tokens=24,
                     http_client=cap.client)
    retriever = RunnableLambda(lambda q: [p for p in PASSAGES if "Dolores" in p or "Golden" in p])
    prompt = ChatPromptTemplate.from_messages([("system", "Answer from the context."),
                                               ("human", "Context:\n\n{context}\n\nQuestion: {question}")])
    rag = {"context": retriever | (lambda docs: "\n\n".join(docs)), "question": RunnablePassthrough()} | prompt | llm
    msg = rag.invoke(QUESTION)
    want = in_process(engine, cap.bodies[-1])
    assert msg.content == want.text and want.text
    assert msg.usage_metadata["input_token_details"]["cache_read"] > 0
    streamed = "".join((rag | StrOutputParser()).stream(QUESTION))
    assert cap.bodies[-1]["stream"] is True and streamed == want.text


def test_llamaindex_openai_like_in_a_query_engine(workers, engine):
    from llama_index.core.query_engine import RetrieverQueryEngine
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, TextNode
    from llama_index.llms.openai_like import OpenAILike

    class Fixed(BaseRetriever):
        def _retrieve(self, query_bundle):
            return [NodeWithScore(node=TextNode(text=p), score=1.0) for p in PASSAGES[:2]]

    cap = Captured()
    llm = OpenAILike(model=MODEL, api_base=workers[1].url + "/v1", api_key="unused", is_chat_model=True,
                     context_window=2048, max_tokens=24, temperature=0, http_client=cap.client)
    qe = RetrieverQueryEngine.from_args(Fixed(), llm=llm)
    answer = str(qe.query(QUESTION))
    want = in_process(engine, cap.bodies[-1])
    assert answer == want.text.strip() or answer == want.text
    usage = httpx.post(workers[1].url + "/v1/chat/completions", json=cap.bodies[-1], timeout=300).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0
    streaming = RetrieverQueryEngine.from_args(Fixed(), llm=llm, streaming=True)
    assert "".join(streaming.query(QUESTION).response_gen).strip() == want.text.strip()


def test_concurrent_rag_requests_equal_each_alone_on_smollm2(workers, engine):
    """Three RAG requests at once on one worker are decoded in shared batched steps, and each gets
    the greedy tokens the in-process engine gives it alone."""
    from concurrent.futures import ThreadPoolExecutor

    questions = [QUESTION, "Where is Alcatraz Island?", "What does the Golden Gate Bridge span?"]
    context = "\n\n".join(PASSAGES)
    bodies = [{"model": MODEL, "max_tokens": 12, "messages": [
        {"role": "user", "content": f"Answer using the passages.\n\n{context}\n\nQuestion: {q}"}]} for q in questions]
    with workers[0].client() as c:
        before = c.get("/metrics").text
        with ThreadPoolExecutor(len(bodies)) as pool:
            rs = list(pool.map(lambda b: c.post("/v1/chat/completions", json=b), bodies))
        after = c.get("/metrics").text
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs]
    got = [r.json()["ragpic"]["token_ids"] for r in rs]
    assert got == [in_process(engine, b).token_ids for b in bodies]
    assert all(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0 for r in rs)
    assert _batched_steps(after) > _batched_steps(before)  # some decode forwards served more than one


def _batched_steps(metrics: str) -> int:
    rows = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line.startswith("ragpic_decode_batch_size_"))
    return int(rows["ragpic_decode_batch_size_count"]) - int(rows['ragpic_decode_batch_size_bucket{le="1"}'])


def test_killing_a_worker_mid_stream_leaves_the_other_serving(workers):
    a, b = workers
    body = {"model": MODEL, "max_tokens": 200, "stream": True,
            "messages": [{"role": "user", "content": "Tell a long story about San Francisco."}]}
    with httpx.Client(base_url=a.url, timeout=60) as ca:
        with pytest.raises(httpx.HTTPError):
            with ca.stream("POST", "/v1/chat/completions", json=body) as r:
                for i, _line in enumerate(r.iter_lines()):
                    if i == 3:
                        a.kill()  # SIGKILL mid-stream
    with b.client() as cb:
        r = cb.post("/v1/chat/completions", json={**body, "stream": False, "max_tokens": 4})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
        assert cb.get("/health").json()["status"] == "ok"
