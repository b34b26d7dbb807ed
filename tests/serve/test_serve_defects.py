"""Four defects of ``ragpic serve`` an audit found, each pinned (tiny random model, real servers):
a key file written ``KEY NAMESPACE`` is refused at start; ``/health`` is 503 ``draining`` during
the shutdown grace; a huge ``max_tokens`` is told the truth (not ">= 1"); the ``Bearer`` scheme
matches in any case (RFC 7235)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest

from serve_helpers import KEY, ROOT, Server, body, tiny_home, wait_for

GOOD_A, GOOD_B, GOOD_B2 = "a" * 16 + "-alice", "b" * 16 + "-bob", "c" * 24


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    # a long window: the stream the shutdown cuts cannot end by its length first on a slow CPU
    return tiny_home(tmp_path_factory, "serve-defects", max_position_embeddings=16384)


@pytest.fixture(scope="module")
def server(home):
    s = Server("--model", str(home / "model"), "--model-id", "tiny", "--store", str(home / "kv"),
               "--api-key", KEY, home=home)
    yield s
    s.stop()


# -- 1. the key file ------------------------------------------------------------------------
def test_a_good_key_file_reads(tmp_path):
    from ragpic.serve.tenants import read_keys_file

    f = tmp_path / "keys.txt"
    f.write_text(f"# namespace key\nalice {GOOD_A}\n\nbob {GOOD_B}  # ops\nbob {GOOD_B2}\n")
    assert read_keys_file(f) == {GOOD_A: "alice", GOOD_B: "bob", GOOD_B2: "bob"}


@pytest.mark.parametrize("text, line, words", [
    (f"{GOOD_A} alice\n{GOOD_B} bob\n", 1, ["key 'alice' is shorter than 16", "NAMESPACE KEY", "swap"]),
    (f"alice {GOOD_A}\nbob {GOOD_A}\n", 2, ["key of line 1 is repeated"]),
    (f"alice {GOOD_A}\nalice {GOOD_A}\n", 2, ["key of line 1 is repeated"]),
    (f"alice {GOOD_A}\n{GOOD_B} carol\nbob {GOOD_B}\n", 2, ["shorter than 16"]),
    (f"{GOOD_B} {GOOD_A}\nalice {GOOD_B}\n", 2, ["its key is also the namespace of line 1", "swap"]),
    (f"alice {GOOD_A}\nbob team-b\n", 2, ["key 'team-b' is shorter than 16 characters"]),
    (f"alice {GOOD_A}\n# fine\nbob {GOOD_B} extra\n", 3, ["expected 'NAMESPACE KEY', got 3 fields"]),
    ("alice\n", 1, ["expected 'NAMESPACE KEY', got 1 fields"]),
])
def test_a_bad_key_file_names_its_line(tmp_path, text, line, words):
    from ragpic.errors import ConfigError
    from ragpic.serve.tenants import read_keys_file

    f = tmp_path / "keys.txt"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        read_keys_file(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}: line {line}: "), msg
    for w in words:
        assert w in msg, msg


def test_serve_refuses_a_swapped_key_file_before_loading(home):
    bad = home / "swapped.txt"
    bad.write_text(f"# namespace key\n{GOOD_A} team-a\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAGPIC_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "ragpic.cli", "serve", "--model", str(home / "model"),
                        "--port", "0", "--api-keys", str(bad)], env=env, cwd=home,
                       capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert f"{bad}: line 2: key 'team-a' is shorter than 16 characters" in out and "did you swap them?" in out
    assert "Loading weights" not in out and "on http://" not in out, out  # refused before the model loads
    assert "Traceback" not in out and time.monotonic() - start < 60


# -- 2. /health while draining --------------------------------------------------------------
def test_health_is_503_draining_during_the_shutdown_grace(home):
    s = Server("--model", str(home / "model"), "--model-id", "tiny", "--store", str(home / "kv-drain"),
               "--shutdown-grace", "5", home=home)
    got: dict = {}
    try:
        with s.client() as c:
            def stream():  # 16k tokens: still decoding when the grace ends
                with c.stream("POST", "/v1/chat/completions", json=body(max_tokens=16000, stream=True)) as r:
                    got["lines"] = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]

            t = threading.Thread(target=stream)
            t.start()
            wait_for(lambda: httpx.get(s.url + "/health").json()["decoding"] == 1)
            assert httpx.get(s.url + "/health").json()["status"] == "ok"
            s.proc.terminate()
            wait_for(lambda: httpx.get(s.url + "/health").status_code == 503, timeout=4)
            h = httpx.get(s.url + "/health")
            assert h.status_code == 503 and h.json()["status"] == "draining", h.text
            assert h.json()["decoding"] == 1 and h.headers["retry-after"] == "1"  # the stream still runs
            assert httpx.head(s.url + "/health").status_code == 503
            t.join(30)
        assert got["lines"][-1] == "[DONE]", got.get("lines", [])[-3:]
        assert json.loads(got["lines"][-2])["error"]["code"] == "shutting_down"
        assert s.proc.wait(timeout=30) == 0
        assert "Traceback" not in s.output()
    finally:
        s.stop()


# -- 3. a huge max_tokens -------------------------------------------------------------------
@pytest.mark.parametrize("path, field, value", [
    ("/v1/chat/completions", "max_tokens", 2 ** 32),
    ("/v1/chat/completions", "max_completion_tokens", 2 ** 32),
    ("/v1/chat/completions", "max_tokens", 2 ** 70),
    ("/v1/completions", "max_tokens", 2 ** 32),
])
def test_a_huge_max_tokens_is_told_the_truth(server, path, field, value):
    sent = {"model": "tiny", field: value, **({"prompt": "hi"} if path == "/v1/completions" else
                                              {"messages": body()["messages"]})}
    with server.client(headers={"Authorization": f"Bearer {KEY}"}) as c:
        r = c.post(path, json=sent)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and ">= 1" not in err["message"], err
    assert f"{field} {value} is more than" in err["message"] and "context window" in err["message"], err
    with server.client(headers={"Authorization": f"Bearer {KEY}"}) as c:  # in range, over the window: 400 too
        r = c.post(path, json={**sent, field: 2 ** 31})
    assert r.status_code == 400 and "context window of 16384" in r.json()["error"]["message"], r.text


# -- 4. the auth scheme's case --------------------------------------------------------------
def test_the_bearer_scheme_matches_in_any_case(server):
    for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):
        r = httpx.get(server.url + "/v1/models", headers={"Authorization": f"{scheme} {KEY}"})
        assert r.status_code == 200, (scheme, r.text)
    r = httpx.post(server.url + "/v1/chat/completions", json=body(), headers={"Authorization": f"bearer {KEY}"},
                   timeout=120)
    assert r.status_code == 200, r.text
    for auth in ("bearer wrong-key", "BEARER wrong-key", f"Basic {KEY}", f"bearer{KEY}", f"Token {KEY}", ""):
        r = httpx.get(server.url + "/v1/models", headers={"Authorization": auth})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (auth, r.text)
    assert httpx.get(server.url + "/v1/models").status_code == 401


# -- 5. a context-cache POST that compiles nothing ------------------------------------------
def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_a_context_cache_post_that_compiles_nothing_leaves_the_server_idle(server):
    """Posting a stored text again (twice) queues no compile: ``compiling`` stays 0 and the
    idle process sleeps (it once spun at ~95% of a core on a compile that never ended)."""
    text = "The idle server test chunk: Dolores Park fills with people who bring a sandwich and sit on the grass."
    auth = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=server.url, headers=auth, timeout=120) as c:
        first = c.post("/v1/context_cache", json={"texts": [text]})
        assert first.status_code == 200 and first.json()["data"][0]["compiled"] is True, first.text
        for _ in range(2):
            again = c.post("/v1/context_cache", json={"texts": [text]})
            assert again.status_code == 200 and again.json()["data"][0]["compiled"] is False, again.text
        health = c.get("/health").json()
    assert health["compiling"] == 0, health
    time.sleep(0.5)  # let any trailing work finish
    before = _cpu_seconds(server.proc.pid)
    time.sleep(3)
    busy = _cpu_seconds(server.proc.pid) - before
    assert busy < 0.5, f"the idle server used {busy:.2f} s of CPU in 3 s"
