"""``benchmarks/serve_vs_llamacpp.py --tiny``: the serving benchmark end to end in seconds, so it cannot rot.

A real ``ragpic serve`` on a loopback port (the embedded SmolLM2, a folder store), the corpus
compiled ahead through ``/v1/context_cache``, then closed loops of 1 and 2 clients through the
``openai`` client; llama-server beside it where ``benchmarks/llamacpp_build.sh`` built it, else a
note that says how to build it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import serve_vs_llamacpp as bench  # noqa: E402


def test_the_workload_is_seeded_zipf_rag_prompts_over_a_corpus_of_at_least_150_chunks():
    chunks = bench.corpus(250, 160)
    assert len(chunks) == 160 and all(len(c.split()) == 250 for c in chunks)
    a, b = bench.workload(chunks, 40, 0, 6, 8), bench.workload(chunks, 40, 0, 6, 8)
    assert a == b and bench.workload(chunks, 40, 1, 6, 8) != a  # the seed alone decides the requests
    counts = [sum(c in m[1]["content"] for c in chunks) for m in a]
    assert all(6 <= n <= 8 for n in counts) and all(m[0]["role"] == "system" for m in a)
    # Zipf popularity: the most used chunk comes back far more often than the median one
    uses = sorted((sum(c in m[1]["content"] for m in a) for c in chunks), reverse=True)
    assert uses[0] >= 8 * max(1, uses[len(uses) // 2])


def test_percentiles_and_the_share_of_equal_answers():
    assert bench.pct([3.0, 1.0, 2.0], 50) == 2.0 and bench.pct([], 95) is None
    shares = bench.same_answers({"ragpic": ["a b", "b "], "ragpic-full": ["a c d", "c"], "llama-server": ["a b", "b"]})
    assert shares == {"ragpic = llama-server": {"same": 1.0, "prefix": 1.0},
                      "ragpic-full = llama-server": {"same": 0.0, "prefix": round((1 / 3 + 0) / 2, 3)}}


def test_the_tiny_run_serves_every_request_and_reports_each_load(tmp_path):
    out = tmp_path / "serve.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/serve_vs_llamacpp.py"), "--tiny", "--json", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    ragpic = [r for r in res["rows"] if r["setup"] == "ragpic"]
    assert [r["clients"] for r in ragpic] == [1, 2]
    for r in ragpic:
        assert r["errors"] == 0 and r["requests"] >= 2 and r["tokens_mean"] > 0
        assert 0 < r["ttft_p50_s"] <= r["ttft_p95_s"] <= r["answer_p95_s"] and r["out_tok_per_s"] > 0
    (opened,) = res["open_rows"]  # --tiny: the default at one Poisson rate
    assert opened["setup"] == "ragpic" and opened["offered_per_s"] == 4.0 and opened["errors"] == 0
    assert opened["requests"] == 3 and 0 < opened["ttft_p50_s"] <= opened["answer_p95_s"] and opened["req_per_s"] > 0
    assert res["compile_s"] > 0 and len(res["answers"]["ragpic"]) == 2 and len(res["answers"]["ragpic-full"]) == 2
    llama = [r for r in res["rows"] if r["setup"] == "llama-server-reuse"]
    if bench.llama_server_binary() is None:
        assert not llama and "llama-server is not built" in res["notes"][0]
    else:
        assert [r["clients"] for r in llama] == [1, 2] and all(r["errors"] == 0 for r in llama)
        assert set(res["same_answers"]) == {"ragpic = llama-server-reuse", "ragpic-full = llama-server-reuse"}


def test_the_tiny_soak_restarts_redis_loses_nothing_and_ends_with_every_gauge_at_zero(tmp_path):
    """``benchmarks/serve_soak.py --tiny``: a minute of Poisson RAG traffic on the embedded model with
    clients that leave mid-stream, bad requests, new documents compiled throughout and Redis
    restarted half-way (a real redis-server with its append-only file)."""
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/serve_soak.py"), "--tiny", "--json", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    v = res["verdicts"]
    assert v["http_5xx"] == 0 and v["bad_not_4xx"] == 0 and v["by_kind"]["ok"] > 0
    assert v["gauges_end"] == {"active": 0, "queued": 0, "compiling": 0, "decoding": 0}
    assert res["store_check"]["rc"] == 0 and v["redis_stop_t_s"] is not None
    assert [e for e in res["events"] if e.get("redis")] and any(e.get("compile") == 200 for e in res["events"])
    assert len(res["samples"]) >= 3 and all("rss_mb" in s for s in res["samples"])
    # the hot tier fills with the compiled documents: the soak counts it apart from the RSS it explains
    assert all(s["bounded_mb"] > 0 for s in res["samples"]) and v["rss_growth_after_5min_beyond_caches"] is not None
