"""``ragpic store plan``: the bytes-per-token formula is the store's real entry size, the Zipf hit
rates are the sums they claim to be, and the command line prints its table or fails with exit 2
naming the flag (docs/SCALING.md)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ragpic.cache.format.entry import encode
from ragpic.cache.tools.plan import KV_FORMATS, Geometry, entry_overhead, make_plan, payload_bytes
from ragpic.cache.tools.sizes import parse_hot, parse_size
from ragpic.cache.tools.zipf import harmonic, lru_hit_rate, top_k_hit_rate, zipf_weights

ROOT = Path(__file__).resolve().parents[2]  # tests/ is on sys.path (tests/conftest.py): tiny, tiny_gguf


@pytest.fixture(scope="module")
def tiny_kv():
    """Real KV: a tiny random llama (2 layers x 2 KV heads x head_dim 16) compiling 3 chunks of
    odd lengths (int4's key groups partly full)."""
    from tiny import tiny_lm

    from ragpic.core.compile import compile_chunks

    lm = tiny_lm("llama")
    gen = torch.Generator().manual_seed(1)
    chunks = [torch.randint(3, 300, (n,), generator=gen) for n in (1, 70, 130)]
    kvs = compile_chunks(lm, chunks)
    cfg = lm.model.config
    g = Geometry(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads)
    assert tuple(kvs[0].keys.shape[::3]) == (g.layers, g.head_dim) and kvs[0].keys.shape[1] == g.kv_heads
    return g, kvs


@pytest.mark.parametrize("kv", list(KV_FORMATS))
def test_formula_is_the_encoded_entry_size(kv, tiny_kv):
    g, kvs = tiny_kv
    dtype, quant = KV_FORMATS[kv]
    frames = set()
    for chunk in kvs:
        c = chunk.to("cpu", getattr(torch, dtype))
        text = "é" * chunk.num_tokens  # two UTF-8 bytes a character: the text is counted in bytes
        data = encode(c, text=text, quant=quant)
        split = entry_overhead(data)
        assert split.payload == payload_bytes(g, kv, chunk.num_tokens), (kv, chunk.num_tokens)
        assert split.text == 2 * chunk.num_tokens and split.tokens == chunk.num_tokens
        frames.add(split.fixed)
        # per token, the formula (+ the text) is the real size within the fixed header overhead
        formula = payload_bytes(g, kv, chunk.num_tokens) + split.text
        assert 0 < len(data) - formula == split.fixed < 600
        assert abs(len(data) / chunk.num_tokens - formula / chunk.num_tokens) <= 600 / chunk.num_tokens
    # the frame is fixed: a few bytes of digits apart whatever the length
    assert max(frames) - min(frames) <= 8 and 250 < min(frames) < 600


def test_bytes_per_token_of_the_embedded_geometry():
    g = Geometry(30, 3, 64)  # SmolLM2-135M; docs/SERVING.md, Sizing Redis: 46,080 B of fp32 KV
    per = {kv: payload_bytes(g, kv, 512) / 512 for kv in KV_FORMATS}
    assert per == {"fp32": 46_080 + 8, "bf16": 23_040 + 8, "int8": 11_880 + 8, "int4": 6_480 + 8}


def test_top_k_is_the_brute_force_sum():
    for n, s in ((1, 1.0), (1000, 0.8), (5000, 1.0), (20_000, 1.2), (3000, 0.0)):
        w = zipf_weights(n, s)
        for k in (0, 1, 17, n // 10, n // 2, n):
            assert top_k_hit_rate(n, s, k) == pytest.approx(math.fsum(w[:k]), rel=1e-10, abs=1e-12)
    # Euler-Maclaurin against an exact sum past its 1000-term head, and at 1e7 (numpy, exact)
    for n, s in ((123_457, 0.8), (123_457, 1.0), (123_457, 1.2)):
        assert harmonic(n, s) == pytest.approx(math.fsum(i ** -s for i in range(1, n + 1)), rel=1e-12)
    import numpy as np

    i = np.arange(1, 10**7 + 1, dtype=np.float64)
    for s in (0.8, 1.0, 1.2):
        assert harmonic(10**7, s) == pytest.approx(float(np.sum(i ** -s)), rel=1e-11)
        assert 0 < top_k_hit_rate(10**7, s, 10**5) < 1


def test_lru_is_below_top_k_and_of_its_order():
    for s in (0.8, 1.0, 1.2):
        for k in (20, 100, 500):
            top, lru = top_k_hit_rate(2000, s, k), lru_hit_rate(2000, s, k, requests=60_000, seed=1)
            assert lru <= top + 0.01 and lru > top / 3, (s, k, lru, top)
    assert lru_hit_rate(500, 1.0, 500, requests=20_000) > 0.99  # the whole corpus: every request after warm-up


def test_sizes_and_hot_sets():
    assert parse_size("64GB") == 64 * 10**9 and parse_size("512MiB") == 512 * 2**20
    assert parse_size("1.5TB") == 1_500_000_000_000 and parse_size("4096") == 4096 and parse_size("2 gib") == 2 * 2**30
    for bad in ("", "GB", "12XB", "-1GB", "0", "1.2.3GB"):
        with pytest.raises(ValueError, match="size"):
            parse_size(bad)
    assert parse_hot("5%").chunks(1000, 1) == 50 and parse_hot("0.1").chunks(1000, 1) == 100
    assert parse_hot("20000").chunks(1000, 1) == 1000 and parse_hot("1MB").chunks(10**6, 300_000) == 3
    for bad in ("2.5", "150%", "lots"):
        with pytest.raises(ValueError, match="percentage"):
            parse_hot(bad)


def test_plan_counts_what_fits():
    g = Geometry(30, 3, 64)
    plan = make_plan(g, chunks=100_000, chunk_tokens=512, formats=["fp32", "int4"], memory=64 * 10**9,
                     hot=[parse_hot("1%"), parse_hot("10GB")], zipf=[1.0], replicas=1, store_bytes_per_entry=200)
    fp32, int4 = plan.formats
    assert fp32.entry_bytes == payload_bytes(g, "fp32", 512) + 4 * 512  # no frame measured: payload + text
    assert fp32.chunks_in_memory == int(32 * 10**9 // (fp32.entry_bytes + 200))
    assert int4.corpus_bytes == 100_000 * int4.entry_bytes
    assert [h.kv for h in plan.hot] == [None, "fp32", "int4"] and plan.hot[0].chunks == 1000
    assert plan.hot[0].lru is None  # 100,000 chunks: past the LRU simulation's limit
    json.dumps(plan.to_json())


# ----- the command line -------------------------------------------------------------------
def test_cli_runs_as_a_module():
    r = subprocess.run([sys.executable, "-m", "ragpic.cli", "store", "plan", "--chunks", "0"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--chunks" in r.stderr and not r.stdout


def test_cli_prints_the_table_and_json(tmp_path, capsys):
    from ragpic.cli import main

    def _cli(*argv: str) -> subprocess.CompletedProcess:
        rc = main(["store", "plan", *argv])
        out = capsys.readouterr()
        return subprocess.CompletedProcess(argv, rc, out.out, out.err)

    from tiny import tiny_config

    folder = tmp_path / "tiny"
    folder.mkdir()
    tiny_config("qwen2", num_hidden_layers=3).to_json_file(folder / "config.json")  # geometry, no weights
    r = _cli("--model", str(folder), "--chunks", "3000", "--chunk-tokens", "128", "--memory", "1MiB",
             "--hot", "5%,64kB", "--zipf", "0.8,1.2", "--kv", "fp32", "int4", "--lru-requests", "20000")
    assert r.returncode == 0, r.stderr
    g = Geometry(3, 2, 16)
    assert "3 layers x 2 KV heads x head_dim 16" in r.stdout
    lines = {line.split()[0]: line for line in r.stdout.splitlines() if line.split()}
    assert f"{payload_bytes(g, 'fp32', 64) // 64:,}" in lines["fp32"] and "int4" in lines
    assert "static top-k / LRU simulated" in r.stdout and "64kB" in r.stdout

    r = _cli("--geometry", "28x2x128", "--chunks", "1000000", "--kv", "int8", "--memory", "64GB",
             "--replicas", "1", "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    (row,) = plan["formats"]
    assert row["bytes_per_token"] == payload_bytes(Geometry(28, 2, 128), "int8", 64) / 64 == 14_568
    assert row["frame_bytes"] > 0 and row["chunks_in_memory"] == 32 * 10**9 // row["entry_bytes"]


@pytest.mark.parametrize("argv, flag", [
    (["--chunks", "0"], "--chunks"),
    (["--chunks", "ten"], "--chunks"),
    (["--chunks", "10", "--memory", "64 lots"], "--memory"),
    (["--chunks", "10", "--model", "/no/such/model"], "--model"),
    (["--chunks", "10", "--hot", "2.5"], "--hot"),
    (["--chunks", "10", "--kv", "fp16"], "--kv"),
    (["--chunks", "10", "--zipf", "x"], "--zipf"),
    (["--chunks", "10", "--geometry", "28x2"], "--geometry"),
    (["--memory", "1GB"], "--chunks"),
])
def test_cli_bad_input_exits_2_naming_the_flag(argv, flag, capsys):
    from ragpic.cli import main

    rc = main(["store", "plan", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and flag in err and len(err.strip().splitlines()) == 1, err


def test_cli_model_file_that_is_not_gguf(tmp_path, capsys):
    from ragpic.cli import main

    f = tmp_path / "model.gguf"
    f.write_bytes(b"not a gguf at all, just bytes" * 4)
    assert main(["store", "plan", "--chunks", "10", "--model", str(f)]) == 2
    assert "--model" in capsys.readouterr().err


def test_gguf_header_geometry(tmp_path):
    pytest.importorskip("gguf")
    from tiny_gguf import write_tiny_gguf

    from ragpic.cli.store_plan import read_geometry

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, "llama")
    g = read_geometry(str(path))
    assert (g.layers, g.kv_heads, g.head_dim, g.source) == (2, 2, 16, "GGUF header")


def test_redis_memory_model_matches_measured_allocations():
    from ragpic.cache.tools.plan import jemalloc_size, redis_entry_bytes

    # MEMORY USAGE of a payload key minus its 120 B of key and object, measured on redis-server
    # 7.0.15 / jemalloc 5.3.0 for SmolLM2 entries of 512 tokens (docs/SCALING.md)
    for entry, held in ((3_324_246, 3_670_016), (6_089_046, 6_291_456), (23_599_447, 25_165_824),
                        (415_837, 458_752)):
        assert jemalloc_size(entry) == held
    assert all(n <= jemalloc_size(n) <= 1.25 * n for n in range(4097, 300_000, 997))
    assert redis_entry_bytes(6_089_046, 2048) == 6_291_456 + 2048 + 635
