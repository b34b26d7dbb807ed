"""``ragpic serve`` against misbehaving clients (tiny random model, a real server process).

OpenAI's validation to the letter (no input reaches a 500, the client's field is named),
admission of a burst from idle, a non-streaming client that goes away, the HTTP surface's
edges (docs behind the key, models/{id}, HEAD /health, header and body timeouts, CL+TE) and
counters that add up. One server serves every case (starting one costs seconds); the shutdown
grace and tenants, which need servers of their own, are in test_serve_lifecycle.py.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from serve_helpers import AUTH, HI, KEY, Server, body, long_body, sentences, tiny_home, wait_for

SENTENCES = sentences()


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tiny_home(tmp_path_factory, "serve-edges")


@pytest.fixture(scope="module")
def server(home):
    s = Server("--model", str(home / "model"), "--model-id", "tiny", "--store", str(home / "kv"),
               "--api-key", KEY, "--max-batch", "2", "--max-queue", "2", "--max-prompt-tokens", "700",
               "--link-piece", "8", "--header-timeout", "2", "--body-timeout", "2", "--max-compile-tokens", "200",
               home=home)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    with server.client(headers=AUTH) as c:
        yield c


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_every_bad_input_is_a_400_naming_the_field(client):
    raw = b'{"model":"tiny","max_tokens":2,"messages":[{"role":"user","content":"a \\ud800 b"}]}'
    cases = [  # (request body: dict or raw bytes, path, status, param)
        (raw, "/v1/chat/completions", 400, "messages[0].content"),
        (b'{"texts": ["a lone \\udc00 surrogate in a chunk text of enough words"]}', "/v1/context_cache", 400,
         "texts[0]"),
        (b"[" * 100_000 + b"]" * 100_000, "/v1/chat/completions", 400, None),
        (body(seed=2 ** 70), "/v1/chat/completions", 400, "seed"),
        (body(seed=-1), "/v1/chat/completions", 400, "seed"),
        (body(temperature=5), "/v1/chat/completions", 400, "temperature"),
        (b'{"model":"tiny","messages":[{"role":"user","content":"hi"}],"temperature":1e999}',
         "/v1/chat/completions", 400, "temperature"),
        (body(messages=[{"role": "wizard", "content": "hi"}]), "/v1/chat/completions", 400, "messages[0].role"),
        (body(n=True), "/v1/chat/completions", 400, "n"),
        (body(stream_options={"include_usage": True}), "/v1/chat/completions", 400, "stream_options"),
        (body(max_tokens=0), "/v1/chat/completions", 400, "max_tokens"),
        ({"model": "tiny", "messages": HI, "max_completion_tokens": 0}, "/v1/chat/completions", 400,
         "max_completion_tokens"),
        (body(max_tokens=5, max_completion_tokens=6), "/v1/chat/completions", 400, "max_tokens"),
        (body(repetition_penalty=1.3), "/v1/chat/completions", 400, "repetition_penalty"),
        (body(top_k=-2), "/v1/chat/completions", 400, "top_k"),
        (body(tools=[{"type": "function", "function": {"name": "f"}}]), "/v1/chat/completions", 400, "tools"),
        ({"model": "tiny", "prompt": "x \ud800"}, "/v1/completions", 400, "prompt"),
    ]
    for sent, path, status, param in cases:
        kw = {"content": sent} if isinstance(sent, bytes) else {"content": json.dumps(sent).encode()}
        r = client.post(path, headers={"content-type": "application/json"}, **kw)
        assert r.status_code == status, (str(sent)[:120], r.status_code, r.text[:300])
        err = r.json()["error"]
        assert err["param"] == param, (str(sent)[:120], err)
        assert "max_new_tokens" not in err["message"], err
    # the client's own field in errors the engine finds after the checks (context overflow)
    for field in ("max_tokens", "max_completion_tokens"):
        r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": HI, field: 5000})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert field in err["message"] and "max_new_tokens" not in err["message"], err
    # at most ~100 characters of what was sent are quoted back
    for sent in (body(model="m" * 100_000), body(method="x" * 100_000), body(cache_ids=["i" * 100_000]),
                 body(temperature="t" * 100_000)):
        r = client.post("/v1/chat/completions", json=sent)
        assert 400 <= r.status_code < 500 and len(r.json()["error"]["message"]) < 400, r.text[:500]
    r = client.get("/v1/context_cache/" + "z" * 50_000)
    assert r.status_code == 404 and len(r.json()["error"]["message"]) < 400
    r = client.post("/v1/context_cache", json={"texts": SENTENCES * 2})  # ~300 tokens: over the 200 bound
    assert r.status_code == 413 and r.json()["error"]["param"] == "texts", r.text[:300]


def test_accepted_fields_are_honoured(client):
    greedy = client.post("/v1/chat/completions", json=body(max_tokens=12)).json()["ragpic"]["token_ids"]
    # top_k=1 samples from one token: the greedy answer, whatever the temperature and seed
    for seed in (1, 2, 3):
        r = client.post("/v1/chat/completions", json=body(max_tokens=12, temperature=1.5, top_k=1, seed=seed))
        assert r.status_code == 200 and r.json()["ragpic"]["token_ids"] == greedy, r.text[:300]
    same = client.post("/v1/chat/completions", json=body(max_tokens=12, max_completion_tokens=12))
    assert same.status_code == 200 and same.json()["usage"]["completion_tokens"] <= 12
    r = client.post("/v1/chat/completions", json=body(repetition_penalty=1.0))
    assert r.status_code == 200
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    r = client.post("/v1/chat/completions", json=body(tools=tools, tool_choice="none"))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
    r = client.post("/v1/chat/completions", json=body(messages=[{"role": "developer", "content": "be brief"}, *HI]))
    assert r.status_code == 200


def burst(client, bodies: list[dict]) -> list[httpx.Response]:
    """Every body sent at once (a barrier releases the threads together)."""
    gate = threading.Barrier(len(bodies))

    def post(b):
        gate.wait()
        return client.post("/v1/chat/completions", json=b, timeout=120)

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(post, bodies))


def test_burst_from_idle_fills_batch_and_queue_then_429(client):
    before = client.get("/metrics").text
    rs = burst(client, [long_body(40)] * 4)  # max_batch 2 + max_queue 2, all at once
    assert [r.status_code for r in rs] == [200] * 4, [r.text[:200] for r in rs]
    rs = burst(client, [long_body(600)] * 5)  # one more than fits (each runs for a second or more)
    codes = sorted(r.status_code for r in rs)
    assert codes == [200] * 4 + [429], codes
    busy = next(r for r in rs if r.status_code == 429)
    assert busy.json()["error"]["code"] == "queue_full" and int(busy.headers["retry-after"]) >= 1
    after = client.get("/metrics").text
    name = 'ragpic_requests_total{outcome="queue_full"}'
    assert metric(after, name) == metric(before, name) + 1
    assert client.get("/health").json()["status"] == "ok"  # a full queue refuses, it does not hang
    assert client.post("/v1/chat/completions", json=body(max_tokens=2)).status_code == 200


def raw_request(server: Server, data: bytes, wait_s: float = 15.0) -> bytes:
    """Send ``data`` on a fresh connection; what comes back until the server closes or ``wait_s``."""
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.settimeout(wait_s)
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            out += b"<timeout>"
        return out


def post_bytes(payload: bytes, extra_headers: str = "", length: int | None = None) -> bytes:
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nConnection: close\r\n{extra_headers}")
    if length is not None:
        head += f"Content-Length: {length}\r\n"
    return head.encode() + b"\r\n" + payload


def test_non_streaming_client_that_leaves_is_cancelled(server, client):
    name_c, name_ok = 'ragpic_requests_total{outcome="cancelled"}', 'ragpic_requests_total{outcome="ok"}'
    before = client.get("/metrics").text
    payload = json.dumps(long_body(600)).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(post_bytes(payload, length=len(payload)))
        # leave once it decodes: a fixed sleep let a loaded CPU close the socket before the
        # server had read the request, which then counts as nothing
        wait_for(lambda: client.get("/health").json()["decoding"] == 1)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        now = client.get("/metrics").text
        if metric(now, name_c) > metric(before, name_c) or metric(now, name_ok) > metric(before, name_ok):
            break
        time.sleep(0.05)
    assert metric(now, name_c) == metric(before, name_c) + 1 and metric(now, name_ok) == metric(before, name_ok)
    assert client.get("/health").json()["active"] == 0


def test_http_edges(server, client):
    with server.client() as anon:
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert anon.get(path).status_code in (401, 404)
            assert client.get(path).status_code == 404  # off unless --docs
        assert anon.head("/health").status_code == 200
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    assert oa.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        oa.models.retrieve("nope")
    t0 = time.monotonic()  # a Content-Length longer than the body: 408 after --body-timeout, no hang
    out = raw_request(server, post_bytes(b'{"model": "tiny"', length=500))
    assert out.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 10, out[:200]
    t0 = time.monotonic()  # headers that never end: closed after --header-timeout
    out = raw_request(server, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    assert b"<timeout>" not in out and time.monotonic() - t0 < 10, out[:200]
    chunked = json.dumps(body()).encode()
    framed = f"{len(chunked):x}\r\n".encode() + chunked + b"\r\n0\r\n\r\n"
    out = raw_request(server, post_bytes(framed, "Transfer-Encoding: chunked\r\n", length=len(framed)))
    assert out.startswith(b"HTTP/1.1 400"), out[:200]
    out = raw_request(server, post_bytes(framed, "Transfer-Encoding: chunked\r\n"))  # TE alone is fine
    assert out.startswith(b"HTTP/1.1 200"), out[:300]


def test_counters_add_up(client):
    ids = [d["id"] for d in client.post("/v1/context_cache", json={"texts": SENTENCES[:3]}).json()["data"]]
    ctx = "\n\n".join(SENTENCES[:3])
    r = client.post("/v1/chat/completions", json={"model": "tiny", "max_tokens": 3, "cache_ids": ids,
                                                  "messages": [{"role": "user", "content": f"{ctx}\n\nq: why?"}]})
    g = r.json()["ragpic"]
    usage = r.json()["usage"]
    assert g["chunks_loaded"] == 3 and g["cached_tokens"] > 0
    assert g["cached_tokens"] + g["recomputed_tokens"] == g["prompt_tokens"] == usage["prompt_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == g["cached_tokens"]
    text = client.get("/metrics").text
    assert (metric(text, "ragpic_cached_tokens_total") + metric(text, "ragpic_recomputed_tokens_total")
            == metric(text, "ragpic_prompt_tokens_total") > 0)
    for gauge in ("ragpic_requests_matching", "ragpic_requests_linking", "ragpic_requests_decoding",
                  "ragpic_queue_depth"):
        assert re.search(rf"^{gauge} \d+$", text, re.M), gauge
    health = client.get("/health").json()
    assert {"matching", "linking", "decoding", "queued", "active"} <= set(health)
