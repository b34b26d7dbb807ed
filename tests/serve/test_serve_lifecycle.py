"""``ragpic serve`` processes with settings of their own (tiny random model): the shutdown grace
ends every request cleanly, tenants see only their own context-cache ids, and the CLI checks
the flags these need before loading anything."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from serve_helpers import AUTH, Server, body, long_body, sentences, tiny_home, wait_for

SENTENCES = sentences()


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    # a long context window, so the stream the shutdown cuts cannot reach its length limit first
    # however slowly the test's own requests get through on a loaded CPU
    return tiny_home(tmp_path_factory, "serve-lifecycle", max_position_embeddings=16384)


def test_shutdown_grace_ends_every_request_cleanly(home):
    s = Server("--model", str(home / "model"), "--model-id", "tiny", "--store", str(home / "kv-grace"),
               "--max-batch", "1", "--max-prompt-tokens", "700", "--shutdown-grace", "1", home=home)
    got: dict = {}
    try:
        with s.client() as c, s.client() as c2:
            def stream_a():  # 16k tokens, far past the grace
                with c.stream("POST", "/v1/chat/completions", json=body(max_tokens=16000, stream=True)) as r:
                    got["a"] = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]

            def whole_b():  # waits behind A (max_batch 1) until the grace ends
                got["b"] = c2.post("/v1/chat/completions", json=long_body(5))

            a = threading.Thread(target=stream_a)
            a.start()
            wait_for(lambda: c2.get("/health").json()["decoding"] == 1)
            b = threading.Thread(target=whole_b)
            b.start()
            wait_for(lambda: httpx.get(s.url + "/health").json()["queued"] == 1)
            s.proc.terminate()
            time.sleep(0.3)
            late = httpx.post(s.url + "/v1/chat/completions", json=body())  # the port stays open
            assert late.status_code == 503 and late.headers["retry-after"] == "1", late.text
            assert late.json()["error"]["code"] == "shutting_down"
            a.join(30)
            b.join(30)
        assert got["a"][-1] == "[DONE]" and json.loads(got["a"][-2]).get("error", {}).get("code") == "shutting_down", \
            (len(got["a"]), got["a"][-3:], s.output()[-2000:])
        assert got["b"].status_code == 503 and got["b"].json()["error"]["code"] == "shutting_down", got["b"].text
        assert s.proc.wait(timeout=30) == 0
        assert "Exception in ASGI application" not in s.output() and "Traceback" not in s.output()
    finally:
        s.stop()


def test_tenants_see_only_their_own_ids(home):
    (home / "keys.txt").write_text("# namespace key\nalice key-a-0123456789abcdef\nbob key-b-0123456789abcdef\nbob key-b2-0123456789abcdef\n")
    s = Server("--model", str(home / "model"), "--model-id", "tiny", "--store", str(home / "kv-tenants"),
               "--api-keys", str(home / "keys.txt"), home=home)
    try:
        a, b, b2 = (s.client(headers={"Authorization": f"Bearer {k}"}) for k in ("key-a-0123456789abcdef", "key-b-0123456789abcdef", "key-b2-0123456789abcdef"))
        with a, b, b2, s.client(headers=AUTH) as stranger:
            assert stranger.get("/v1/models").status_code == 401
            text = SENTENCES[0]
            da = a.post("/v1/context_cache", json={"texts": [text]}).json()["data"][0]
            assert da["compiled"] is True
            # bob stores the same text: a new id, and "compiled" does not reveal that alice had it
            db = b.post("/v1/context_cache", json={"texts": [text]}).json()["data"][0]
            assert db["compiled"] is True and db["id"] != da["id"]
            assert b2.get(f"/v1/context_cache/{db['id']}").json()["text"] == text  # bob's other key
            for c, other in ((b, da["id"]), (a, db["id"])):
                assert c.get(f"/v1/context_cache/{other}").status_code == 404
                assert c.delete(f"/v1/context_cache/{other}").status_code == 404
                r = c.post("/v1/chat/completions", json=body(cache_ids=[other]))
                assert r.status_code == 404 and r.json()["error"]["param"] == "cache_ids"
            assert b.delete(f"/v1/context_cache/{db['id']}").json()["deleted"] is True
            assert b.get(f"/v1/context_cache/{db['id']}").status_code == 404
            # alice's reference keeps the shared KV: her id still reads and links from the store
            assert a.get(f"/v1/context_cache/{da['id']}").json()["text"] == text
            r = a.post("/v1/chat/completions", json=body(cache_ids=[da["id"]], messages=[
                {"role": "user", "content": f"{text}\n\nq: why?"}]))
            assert r.status_code == 200 and r.json()["ragpic"]["chunks_loaded"] == 1, r.text[:300]
            assert a.delete(f"/v1/context_cache/{da['id']}").json()["deleted"] is True
            assert a.get(f"/v1/context_cache/{da['id']}").status_code == 404
            again = b.post("/v1/context_cache", json={"texts": [text]}).json()["data"][0]
            assert again["id"] == db["id"] and again["compiled"] is True  # the last reference went: stored anew
    finally:
        s.stop()


def test_a_prompt_reveals_nothing_another_namespace_stored(home):
    """Bob's prompt holding a text only alice stored: no cached token, no chunk loaded, the same
    answer fields as a text nobody stored; once bob stores it himself, it links from the store."""
    (home / "keys2.txt").write_text("alice key-a-0123456789abcdef\nbob key-b-0123456789abcdef\n")
    s = Server("--model", str(home / "model"), "--model-id", "tiny", "--store", str(home / "kv-reveal"),
               "--api-keys", str(home / "keys2.txt"), "--method", "fast", home=home)  # keeps a short text's rows
    try:
        a, b = (s.client(headers={"Authorization": f"Bearer {k}"}) for k in ("key-a-0123456789abcdef", "key-b-0123456789abcdef"))
        with a, b:
            theirs, nobodys = SENTENCES[1], SENTENCES[2]
            assert a.post("/v1/context_cache", json={"texts": [theirs]}).status_code == 200

            def usage(c, text: str, **extra) -> dict:
                r = c.post("/v1/chat/completions", json=body(messages=[
                    {"role": "user", "content": f"{text}\n\nq: why?"}], **extra))
                assert r.status_code == 200, r.text[:300]
                g = r.json()["ragpic"]
                return {"cached": r.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
                        **{k: g[k] for k in ("chunks_matched", "chunks_loaded", "chunks_compiled")}}

            assert usage(a, theirs)["cached"] > 0 and usage(a, theirs)["chunks_loaded"] == 1  # alice finds hers
            for hints in ({}, {"hints": [theirs]}):  # found by the catalog, or named as a hint
                seen = usage(b, theirs, **hints)
                unseen = usage(b, nobodys, **({"hints": [nobodys]} if hints else {}))
                assert seen["cached"] == 0 and seen["chunks_loaded"] == 0, seen
                assert seen == unseen, (seen, unseen)
            assert usage(b, theirs, hints=[theirs])["cached"] > 0  # compiled for bob on his miss: now his
    finally:
        s.stop()


def test_a_namespace_never_links_the_leading_text_another_sent(home):
    """The same system prompt from alice, then bob: bob's first request links none of the rows
    alice's left in the prefix cache (its ``cached_tokens`` are alice's first's), his second his own."""
    (home / "keys3.txt").write_text("alice key-a-0123456789abcdef\nbob key-b-0123456789abcdef\n")
    s = Server("--model", str(home / "model"), "--model-id", "tiny", "--store", str(home / "kv-salt"),
               "--api-keys", str(home / "keys3.txt"), home=home)
    system = "you answer from the passages only, in one short line, and say so when they do not say."
    try:
        a, b = (s.client(headers={"Authorization": f"Bearer {k}"}) for k in ("key-a-0123456789abcdef", "key-b-0123456789abcdef"))
        with a, b:
            chunk = SENTENCES[3]
            for c in (a, b):
                assert c.post("/v1/context_cache", json={"texts": [chunk]}).status_code == 200

            def cached(c) -> int:
                r = c.post("/v1/chat/completions", json=body(messages=[
                    {"role": "system", "content": system}, {"role": "user", "content": f"{chunk}\n\nq: why?"}]))
                assert r.status_code == 200, r.text[:300]
                assert r.json()["ragpic"]["chunks_loaded"] == 1
                return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

            first, second = cached(a), cached(a)
            assert second > first > 0  # alice's second links her leading text from her first
            assert cached(b) == first  # bob's first: nothing of alice's
            assert cached(b) == second  # his own, from then on
    finally:
        s.stop()


def test_the_kv_budget_refuses_a_request_that_cannot_fit(home):
    s = Server("--model", str(home / "model"), "--model-id", "tiny", "--store", str(home / "kv-budget"),
               "--max-kv-rows", "200", home=home)
    try:
        with s.client() as c:
            r = c.post("/v1/chat/completions", json=body(max_tokens=190))
            assert r.status_code == 413 and r.json()["error"]["param"] == "max_tokens", r.text
            assert r.json()["error"]["code"] == "kv_budget_exceeded" and "--max-kv-rows" in r.text
            r = c.post("/v1/chat/completions", json=long_body(2))  # ~360 prompt tokens: over alone
            assert r.status_code == 413 and r.json()["error"]["param"] == "messages", r.text
            assert c.post("/v1/chat/completions", json=body(max_tokens=4)).status_code == 200
    finally:
        s.stop()


def test_cli_checks_tenant_and_timeout_flags(capsys, tmp_path):
    from ragpic.cli import main

    assert main(["serve", "--api-keys", str(tmp_path / "nope")]) == 2
    (tmp_path / "bad").write_text("alice key-a extra\n")
    assert main(["serve", "--api-keys", str(tmp_path / "bad")]) == 2
    assert main(["serve", "--body-timeout", "-1"]) == 2
    assert main(["serve", "--shutdown-grace", "nan"]) == 2
    assert main(["serve", "--max-kv-rows", "-1"]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "expected 'NAMESPACE KEY'" in err and "--body-timeout" in err and "--shutdown-grace" in err
    assert main(["serve", "--compile-behind", "17"]) == 2  # Config's bound, before anything loads
    assert "--compile-behind: compile_behind must be at most 16" in capsys.readouterr().err
    assert main(["serve", "--compile-behind", "2", "--compile-head", ""]) == 2
    assert "--compile-head: compile_head must be True" in capsys.readouterr().err
