"""The scheduler's turns in a real server process (tiny random model with a 4k window, loopback port).

What the policy promises (docs/SERVING.md, *The turn*) checked on the server's own turn log
(``/metrics``): a compile runs in pieces between the running streams' decode steps, never two
pieces between two steps, and a compile whose client leaves stops, leaving only whole chunks
in the store. Structure, not wall-clock times: the speed is bench_serve's to measure.
"""

from __future__ import annotations

import json
import random
import re
import socket
import threading

import httpx
import pytest

from serve_helpers import Server, sentences, wait_for
from tiny import saved_tiny_model, tiny_tokenizer

STREAM = {"model": "tiny", "method": "full", "max_tokens": 1500, "stream": True,
          "messages": [{"role": "user", "content": "hi there, who are you?"}]}


def document(i: int, tokens: int = 1500) -> str:
    """A distinct text of about ``tokens`` tokens (the tiny corpus's sentences, shuffled by ``i``)."""
    rng, words, out = random.Random(i), sentences(), [f"document {i}:"]
    while len(tiny_tokenizer()(" ".join(out), add_special_tokens=False)["input_ids"]) < tokens:
        out.append(rng.choice(words))
    return " ".join(out)


def metric(text: str, name: str) -> float:
    """The value of ``name`` (with its labels, e.g. ``ragpic_pieces_total{...}``) in /metrics text, 0 if absent."""
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def compile_pieces(text: str) -> float:
    """Compile pieces run so far, while requests decoded or not."""
    return sum(metric(text, f'ragpic_pieces_total{{decoding="{d}",kind="compile"}}') for d in ("yes", "no"))


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("serve-turns")
    saved_tiny_model(home / "model", max_position_embeddings=4096)
    return home


@pytest.fixture(scope="module")
def server(home):
    s = Server("--model", str(home / "model"), "--model-id", "tiny", "--store", str(home / "kv"),
               "--max-batch", "8", "--link-piece", "512", "--max-compile-tokens", "65536", home=home)
    yield s
    s.stop()


def streams(server: Server, n: int, stop: threading.Event) -> list[threading.Thread]:
    """``n`` long streams decoding until ``stop`` (then their clients leave, cancelling them)."""
    def one():
        with httpx.Client(base_url=server.url, timeout=120) as c:
            with c.stream("POST", "/v1/chat/completions", json=STREAM) as r:
                for _ in r.iter_lines():
                    if stop.is_set():
                        return

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def test_a_compile_runs_in_pieces_between_the_streams_decode_steps(server):
    texts = [document(i) for i in range(8)]
    sizes = [len(tiny_tokenizer()(t, add_special_tokens=False)["input_ids"]) for t in texts]
    assert all(1400 <= n <= 1700 for n in sizes)
    stop = threading.Event()
    threads = streams(server, 4, stop)
    try:
        wait_for(lambda: httpx.get(server.url + "/health").json()["decoding"] == 4, 60)
        r = httpx.post(server.url + "/v1/context_cache", json={"texts": texts}, timeout=300)
        assert r.status_code == 200, r.text
        assert r.json()["compiled"] == 8
        decoding_after = httpx.get(server.url + "/health").json()["decoding"]
        m = httpx.get(server.url + "/metrics").text
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert decoding_after == 4, "the streams must outlast the compile for the check to mean anything"
    # every piece ran while the four streams decoded, one piece of <= 512 rows between two of
    # their steps: each ~1.5k-token chunk in parts of 512 rows
    assert metric(m, 'ragpic_pieces_total{decoding="yes",kind="compile"}') == sum(-(-n // 512) for n in sizes)
    assert metric(m, "ragpic_pieces_between_decode_steps_max") == 1
    assert metric(m, "ragpic_compile_piece_rows_max") == 512
    assert metric(m, 'ragpic_compiles_total{outcome="ok"}') >= 1
    with httpx.Client(base_url=server.url, timeout=120) as c:
        body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": f"{texts[3]}\n\nq?"}]}
        usage = c.post("/v1/chat/completions", json=body).json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] > 1000


def test_a_compile_whose_client_leaves_stores_only_its_finished_chunks(server, home):
    texts = [document(100 + i) for i in range(24)]
    parts = [-(-len(tiny_tokenizer()(t, add_special_tokens=False)["input_ids"]) // 512) for t in texts]
    stop = threading.Event()
    threads = streams(server, 4, stop)
    before = httpx.get(server.url + "/metrics").text
    done_before = compile_pieces(before)
    payload = json.dumps({"texts": texts}).encode()
    try:
        wait_for(lambda: httpx.get(server.url + "/health").json()["decoding"] == 4, 60)
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(b"POST /v1/context_cache HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
            # leave once the compile has finished two chunks (of 24), each in parts
            wait_for(lambda: compile_pieces(httpx.get(server.url + "/metrics").text) >= done_before + sum(parts[:2]), 60)
        wait_for(lambda: httpx.get(server.url + "/health").json()["compiling"] == 0, 60)
        m = httpx.get(server.url + "/metrics").text
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    ran = int(compile_pieces(m) - done_before)
    assert metric(m, 'ragpic_compiles_total{outcome="cancelled"}') == 1
    assert sum(parts[:2]) <= ran < sum(parts)  # the rest were dropped
    whole = max(k for k in range(len(texts) + 1) if sum(parts[:k]) <= ran)  # chunks whose every part ran
    from ragpic import Config, RagPic

    keys = [RagPic(Config(model=str(home / "model"), store=None, device="cpu")).chunk_key(t) for t in texts]

    def stored() -> list[bool]:  # shared mode: a context-cache id is the store key
        return [httpx.get(f"{server.url}/v1/context_cache/{k}").status_code == 200 for k in keys]

    wait_for(lambda: sum(stored()) >= whole, 30)  # the handler's thread writes the last finished chunk
    assert stored() == [True] * whole + [False] * (len(texts) - whole)  # exactly the finished chunks, no part
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": f"{texts[whole - 1]}\n\nq?"}]}
    usage = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > 1000  # the last one stored is whole: it links
