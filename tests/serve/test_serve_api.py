"""``ragpic serve`` on a tiny random model: a real server process on a loopback port.

Protocol (OpenAI bodies, SSE), EPIC's context-cache API, continuous batching giving the same
greedy ids as the in-process engine, and the 4xx cases (the 429 of a full queue: test_serve_edges).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from ragpic.engine.calibration import FALLBACK

from serve_helpers import Server, tiny_home
from tiny import TEXT

KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}
SENTENCES = [s.strip() + "." for s in TEXT.split(".") if len(s.split()) >= 6]
QUESTIONS = ["what is the best thing to do in san francisco?", "where does the needle hide?",
             "why do the keys rotate?", "what does the fox jump over?", "what is compiled once?",
             "who sits in the sun?"]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tiny_home(tmp_path_factory, "serve")


@pytest.fixture(scope="module")
def server(home):
    s = Server("--model", str(home / "model"), "--model-id", "tiny", "--store", str(home / "kv"),
               "--api-key", KEY, "--max-batch", "4", "--max-queue", "6", "--max-prompt-tokens", "400", home=home)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def engine(home):
    from ragpic import Config, RagPic

    return RagPic(Config(model=str(home / "model"), store=None, device="cpu"))


@pytest.fixture(scope="module")
def client(server):
    with server.client(headers=AUTH) as c:
        yield c


def chat_body(question: str, n: int = 10, **extra) -> dict:
    ctx = "\n\n".join(SENTENCES[:2])
    return {"model": "tiny", "messages": [{"role": "user", "content": f"{ctx}\n\nquestion: {question}"}],
            "max_tokens": n, **extra}


def test_models_health_and_metrics(client):
    assert client.get("/health").json()["status"] == "ok"
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["tiny"]
    text = client.get("/metrics").text
    for name in ("ragpic_ttft_seconds_bucket", "ragpic_link_seconds_count", "ragpic_cache_hits_total",
                 "ragpic_cache_misses_total", "ragpic_chunks_compiled_total", "ragpic_recomputed_tokens_total",
                 "ragpic_queue_depth", "ragpic_active_requests"):
        assert name in text


def test_memory_gauges_show_what_the_hot_tier_and_the_pool_hold(client, engine):
    """The two bounded memories a server fills (so a soak can tell a growing RSS from a leak):
    the hot tier's bytes grow by each compiled entry's decoded KV, and after a request its
    cache's slabs wait idle in the pool."""
    def gauge(name: str) -> float:
        line = next(l for l in client.get("/metrics").text.splitlines() if l.startswith(name + " "))
        return float(line.split()[1])

    before = gauge("ragpic_store_memory_bytes")
    assert client.post("/v1/context_cache", json={"texts": SENTENCES[2:4]}).status_code == 200
    after = gauge("ragpic_store_memory_bytes")
    lm = engine.lm
    tokens = sum(len(lm.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in SENTENCES[2:4])
    per_token = lm.num_layers * 2 * lm.num_kv_heads * lm.head_dim  # K and V, at least a byte each
    assert after - before >= tokens * per_token > 0
    assert client.post("/v1/chat/completions", json=chat_body("what?", 2)).status_code == 200
    assert gauge("ragpic_cache_pool_idle_bytes") > 0


def test_context_cache_round_trip_and_cached_tokens(client, engine):
    r = client.post("/v1/context_cache", json={"texts": SENTENCES[:2]})
    assert r.status_code == 200, r.text
    ids = [d["id"] for d in r.json()["data"]]
    assert ids == [engine.chunk_key(t) for t in SENTENCES[:2]]  # stable ids = store keys
    assert client.get(f"/v1/context_cache/{ids[0]}").json()["text"] == SENTENCES[0]
    again = client.post("/v1/context_cache", json={"texts": SENTENCES[:2]}).json()
    assert again["compiled"] == 0
    body = client.post("/v1/chat/completions", json=chat_body(QUESTIONS[0], cache_ids=ids)).json()
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert body["ragpic"]["chunks_loaded"] == 2 and body["ragpic"]["hints_found"] == 2
    engine.compile(SENTENCES[:2])
    want = engine.generate(chat_body(QUESTIONS[0])["messages"], max_new_tokens=10)
    assert body["ragpic"]["token_ids"] == want.token_ids
    assert body["choices"][0]["message"]["content"] == want.text
    assert body["usage"]["completion_tokens"] == len(want.token_ids)


def test_context_cache_delete_and_unknown_ids(client):
    text = SENTENCES[3]
    cid = client.post("/v1/context_cache", json={"texts": [text]}).json()["data"][0]["id"]
    assert client.delete(f"/v1/context_cache/{cid}").json()["deleted"] is True
    r = client.get(f"/v1/context_cache/{cid}")
    assert r.status_code == 404 and r.json()["error"]["code"] == "cache_id_not_found"
    assert client.delete(f"/v1/context_cache/{cid}").status_code == 404
    r = client.post("/v1/chat/completions", json=chat_body("q", cache_ids=["0" * 64]))
    assert r.status_code == 404 and r.json()["error"]["param"] == "cache_ids"
    r = client.post("/v1/context_cache", json={"texts": ["too short"]})
    assert r.status_code == 400 and "min_chunk_tokens" in r.json()["error"]["message"]


def sse_events(client, path: str, body: dict) -> list[dict]:
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


def test_stream_equals_whole_answer(client):
    whole = client.post("/v1/chat/completions", json=chat_body(QUESTIONS[1])).json()
    events = sse_events(client, "/v1/chat/completions",
                        chat_body(QUESTIONS[1], stream=True, stream_options={"include_usage": True}))
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] in ("stop", "length")
    assert events[-1]["usage"] == whole["usage"] and events[-1]["ragpic"]["method"] == FALLBACK  # auto on a model with no calibration


def test_completions_raw_prompt_equals_engine(client, engine):
    prompt = SENTENCES[0] + " question: " + QUESTIONS[2]
    body = client.post("/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 8}).json()
    want = engine.generate(prompt, chat=False, max_new_tokens=8)
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == want.text
    assert body["ragpic"]["token_ids"] == want.token_ids
    events = sse_events(client, "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 8, "stream": True})
    assert "".join(e["choices"][0]["text"] for e in events) == want.text


def test_stop_string_is_honoured(client):
    whole = client.post("/v1/chat/completions", json=chat_body(QUESTIONS[0], n=16)).json()
    text = whole["choices"][0]["message"]["content"]
    if len(text) < 4:
        pytest.skip("the tiny model answered too little to cut")
    stop = text[2:4]
    cut = client.post("/v1/chat/completions", json=chat_body(QUESTIONS[0], n=16, stop=[stop])).json()
    assert cut["choices"][0]["message"]["content"] == text[:text.find(stop)]
    assert cut["choices"][0]["finish_reason"] == "stop"


def test_concurrent_requests_equal_sequential_and_batch(client, engine):
    bodies = [chat_body(q, n=14) for q in QUESTIONS]
    sequential = [client.post("/v1/chat/completions", json=b).json()["ragpic"]["token_ids"] for b in bodies]
    before = client.get("/metrics").text
    with ThreadPoolExecutor(len(bodies)) as pool:
        rs = list(pool.map(lambda b: client.post("/v1/chat/completions", json=b), bodies))
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200]
    assert [r.json()["ragpic"]["token_ids"] for r in rs] == sequential
    assert [engine.generate(b["messages"], max_new_tokens=14).token_ids for b in bodies] == sequential
    assert batched_steps(client.get("/metrics").text) > batched_steps(before)  # some forwards served >1


def batched_steps(metrics: str) -> int:
    """Decode forwards that served more than one request."""
    rows = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line.startswith("ragpic_decode_batch_size_"))
    return int(rows["ragpic_decode_batch_size_count"]) - int(rows['ragpic_decode_batch_size_bucket{le="1"}'])


@pytest.mark.parametrize("body, status, code_or_param", [
    (b"{not json", 400, None),
    ({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, 404, "model_not_found"),
    ({"model": "tiny", "messages": []}, 400, "messages"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": -1}, 400, None),
    ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "logprobs": True}, 400, "logprobs"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "fox " * 600}]}, 400, "context_length_exceeded"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x" * 7000}]}, 400, "context_length_exceeded"),
])
def test_bad_requests_get_json_4xx(client, body, status, code_or_param):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = client.post("/v1/chat/completions", **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] == "invalid_request_error"
    if code_or_param:
        assert code_or_param in (err["code"], err["param"])


def test_auth_body_limit_and_unknown_route(server, client):
    with server.client() as anon:
        r = anon.post("/v1/chat/completions", json=chat_body("q"))
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = client.post("/v1/chat/completions", content=b"{" + b" " * (5 << 20) + b"}")
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()


def test_cli_checks_arguments_before_loading(capsys, tmp_path):
    from ragpic.cli import main
    from ragpic.cli.serve import default_store

    assert main(["serve", "--port", "99999"]) == 2
    assert main(["serve", "--model", str(tmp_path / "nope")]) == 2
    assert main(["serve", "--max-batch", "0"]) == 2
    err = capsys.readouterr().err
    assert "--port 99999" in err and "no such folder" in err and "--max-batch" in err
    assert default_store().endswith("serve/kv")
