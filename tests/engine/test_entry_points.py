"""One prompt, four entry points, one meaning of every count (docs/ARCHITECTURE.md §1.2).

``RagPic.generate``, the LlamaIndex LLM, the LangChain chat model and ``ragpic serve`` all drive
the engine's :class:`~ragpic.engine.request.LinkedRequest`, so for the same chat messages over
the same stored chunks they must give the same greedy text and the same ``cached_tokens`` /
``recomputed_tokens`` / ``prompt_tokens``. The server is a real process on loopback with its
own store, filled through ``/v1/context_cache``; nobody passes hints, so every entry point
finds the chunks in the prompt the same way (the store's catalog).
"""

from __future__ import annotations

import pytest

from serve_helpers import Server

pytestmark = pytest.mark.integration

MODEL = "smollm2-135m-instruct"
PASSAGES = [
    "Dolores Park is a city park in the Mission District of San Francisco. On sunny days it fills with "
    "people who bring a sandwich and sit on the grass.",
    "The Golden Gate Bridge is a suspension bridge spanning the Golden Gate, the strait between San "
    "Francisco Bay and the Pacific Ocean.",
]
PROMPT = "Answer using the passages.\n\n" + "\n\n".join(PASSAGES) + "\n\nQuestion: What do people do in Dolores Park?"
N = 16
KEYS = ("prompt_tokens", "cached_tokens", "recomputed_tokens", "chunks_matched", "chunks_loaded")


@pytest.fixture(scope="module")
def engine(smol):
    from ragpic import Config, RagPic

    e = RagPic(Config(store=None, max_new_tokens=N), lm=smol)
    e.compile(PASSAGES)
    return e


@pytest.mark.parametrize("method", ["legolink-16", "full"])
def test_one_prompt_gives_the_same_answer_and_counts_through_all_four(engine, tmp_path, method):
    from langchain_core.messages import HumanMessage
    from llama_index.core.llms import ChatMessage

    from ragpic.llm.langchain import ChatRagPic
    from ragpic.llm.llamaindex import RagPicLLM

    cold = engine.generate([{"role": "user", "content": PROMPT}], method=method)
    g = engine.generate([{"role": "user", "content": PROMPT}], method=method)  # the template's head now kept
    want = {"text": g.text, **{k: getattr(g, k) for k in KEYS}}
    assert g.text == cold.text and g.cached_tokens >= cold.cached_tokens
    assert g.text and g.chunks_loaded == (2 if method != "full" else 0)
    if method == "legolink-16":  # the first chunk's tokens are kept; the second's first 16 recomputed
        assert 0 < g.cached_tokens < g.prompt_tokens - g.recomputed_tokens + 1

    li = RagPicLLM(engine, max_new_tokens=N, method=method).chat([ChatMessage(role="user", content=PROMPT)])
    got_li = {"text": li.message.content, **{k: li.additional_kwargs[k] for k in KEYS}}

    lc = ChatRagPic(engine=engine, max_new_tokens=N, method=method).invoke([HumanMessage(PROMPT)])
    got_lc = {"text": lc.content, **{k: lc.response_metadata[k] for k in KEYS}}

    server = Server("--max-batch", "2", "--method", method, home=tmp_path, isolate=False, timeout_s=300)
    try:
        with server.client() as c:
            assert c.post("/v1/context_cache", json={"texts": PASSAGES}).status_code == 200
            for _ in range(2):  # the second as warm as the engine's
                r = c.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": N, "temperature": 0,
                                                         "messages": [{"role": "user", "content": PROMPT}]})
    finally:
        server.stop()
    assert r.status_code == 200, r.text
    body = r.json()
    got_http = {"text": body["choices"][0]["message"]["content"], **{k: body["ragpic"][k] for k in KEYS}}
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == want["cached_tokens"]
    assert got_li == want and got_lc == want and got_http == want
