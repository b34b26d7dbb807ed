"""FLOP counting against the closed form, and a tiny end-to-end `ragpic bench`."""

from __future__ import annotations

import json
import sys

import pytest


def test_flops_closed_form_and_limits():
    from tiny import tiny_lm

    import torch

    from ragpic.eval.bench import _cfg_sizes, method_flops
    from ragpic.core.compile import compile_chunks
    from ragpic.core.segments import Segment, chunk_segment

    lm = tiny_lm("llama", num_hidden_layers=4)
    s = _cfg_sizes(lm)
    L = 4
    # q, k, v, o + gated MLP of the tiny config: 64x64 + 2x64x32 + 64x64 + 3x64x128
    assert s["linear_params"] == 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128
    kvs = compile_chunks(lm, [list(range(3, 35)), list(range(40, 72))])
    segs = [chunk_segment(kv) for kv in kvs] + [Segment(torch.arange(5, 13))]
    n = 72
    head = 2 * 64 * 320
    per_tok = 2 * s["linear_params"]
    full = method_flops(lm, segs, "full")
    assert full == pytest.approx(L * (per_tok * n + 4 * 64 * n * (n + 1) / 2) + head)
    # naive recomputes the 8 query tokens (positions 64..71)
    naive = method_flops(lm, segs, "naive")
    assert naive == pytest.approx(L * (per_tok * 8 + 4 * 64 * sum(p + 1 for p in range(64, 72))) + head)
    lego = method_flops(lm, segs, "legolink-4")  # + first 4 of the second chunk (positions 32..35)
    assert lego == pytest.approx(naive + L * (per_tok * 4 + 4 * 64 * sum(p + 1 for p in range(32, 36))))
    # k covering everything: all but the first chunk (which starts at 0 and is never recomputed)
    assert method_flops(lm, segs, "legolink-1000") == pytest.approx(full - L * (per_tok * 32 + 4 * 64 * sum(range(1, 33))))
    # cacheblend: layers 0-1 see everything, layers 2-3 the query + 15% of the chunk tokens
    blend = method_flops(lm, segs, "cacheblend-15")
    assert naive < blend < full
    assert blend == pytest.approx(2 * (full - head) / L + head + 2 * (per_tok * (8 + 10) + 4 * 64 * (
        sum(p + 1 for p in range(64, 72)) + 0.15 * sum(range(1, 65)))))
    # qr: its legolink-4 first pass, then 10% of the tokens of the chunks that can be wrong (the
    # second: the first starts at 0, where its KV is full's) (4 rows, spread) + the 8 query rows again
    qr = method_flops(lm, segs, "qr-10-k4")
    assert qr == pytest.approx(lego + L * (per_tok * (4 + 8) + 4 * 64 * (
        sum(p + 1 for p in range(64, 72)) + 0.1 * sum(range(33, 65)))) + head)
    # qp: its probe pass (legolink-4's rows through 2 of the 4 layers), then one forward over
    # legolink-4's rows plus 10% of the second chunk's tokens (4 rows, spread)
    qp = method_flops(lm, segs, "qp-10-k4")
    assert qp == pytest.approx(lego + (lego - head) / 2 + L * (per_tok * 4 + 4 * 64 * 0.1 * sum(range(33, 65))))
    # probing 3 of the 4 layers instead
    deep = method_flops(lm, segs, "qp-10-k4-d75")
    assert deep == pytest.approx(qp + (lego - head) / 4)


def test_bench_tiny_end_to_end(tmp_path):
    from tiny import TEXT, tiny_lm

    from ragpic.eval.bench import format_table, plot_bench, run_bench

    lm = tiny_lm("llama")
    res = run_bench(lm, text=TEXT * 8, context_tokens=[96, 192], chunk_tokens=32, k=4, query_tokens=8, repeats=2)
    rows = res["rows"]
    methods = res["config"]["methods"]
    assert methods == ["full", "naive", "legolink-0", "legolink-4", "cacheblend-15"]
    assert len(rows) == 2 * len(methods)
    for r in rows:
        for key in ("context_tokens", "method", "ttft_median_s", "ratio_vs_full", "flop_limit_ratio", "peak_mem_mb"):
            assert key in r
        assert r["ttft_median_s"] > 0 and len(r["ttft_s"]) == 2
        assert r["peak_mem_mb"] > 0
    by = {(r["context_tokens"], r["method"]): r for r in rows}
    assert by[(192, "full")]["ratio_vs_full"] == 1.0 and by[(192, "full")]["flop_limit_ratio"] == 1.0
    assert by[(192, "full")]["recomputed_tokens"] == 192
    assert by[(192, "naive")]["recomputed_tokens"] == 8
    assert by[(192, "legolink-4")]["recomputed_tokens"] == 8 + 4 * 5  # 6 chunks, the first starts at 0
    assert by[(192, "naive")]["flop_limit_ratio"] > by[(192, "legolink-4")]["flop_limit_ratio"] > 1
    assert by[(192, "cacheblend-15")]["flop_limit_ratio"] < by[(192, "legolink-4")]["flop_limit_ratio"]
    assert "legolink-4" in format_table(res)
    assert plot_bench(res, tmp_path / "b.png").exists()
    json.dumps(res)


def _cli_args(tmp_path, out, *extra: str) -> list[str]:
    """``ragpic bench`` on a saved tiny model and a one-file haystack, writing JSON to ``out``."""
    from tiny import TEXT, saved_tiny_model

    hay = tmp_path / "hay"
    hay.mkdir()
    (hay / "a.txt").write_text(TEXT * 4)
    return ["bench", "--haystack", str(hay), "--model", str(saved_tiny_model(tmp_path / "m")), "--device", "cpu",
            "--chunk-tokens", "32", "--query-tokens", "8", "--repeats", "1", "--no-memory", "--json", str(out),
            "--quiet", *extra]


def test_cli_bench(tmp_path, capsys):
    from ragpic.cli import main

    out = tmp_path / "bench.json"
    assert main(_cli_args(tmp_path, out, "--context-tokens", "64,128", "--k", "2", "--methods", "naive,legolink")) == 0
    data = json.loads(out.read_text())
    assert {r["method"] for r in data["rows"]} == {"full", "naive", "legolink-2"}
    assert all(r["peak_mem_mb"] is None for r in data["rows"])  # NaN -> null in JSON
    assert "ttft_s" in capsys.readouterr().out


def test_bench_times_whole_answers_with_answer_tokens(tmp_path, capsys):
    """--answer-tokens: every method's request decodes its answer; TTFT, decode rate and the
    whole answer's time come per row, and the CLI adds the weights, bandwidth and peak RSS."""
    from tiny import TEXT, tiny_lm

    from ragpic.cli import main
    from ragpic.eval.bench import format_table, run_bench

    lm = tiny_lm("llama")
    lm.model.generation_config.eos_token_id = None  # every answer runs to its 6 tokens
    res = run_bench(lm, text=TEXT * 8, context_tokens=[96], chunk_tokens=32, query_tokens=8, repeats=2,
                    methods=["legolink-4"], measure_memory=False, answer_tokens=6)
    for r in res["rows"]:
        assert r["answer_tokens"] == 6 and r["decode_tok_s"] > 0
        assert r["answer_median_s"] > r["ttft_median_s"] > 0 and len(r["answer_s"]) == 2
    assert "answer6_s" in format_table(res)

    out = tmp_path / "bench.json"
    assert main(_cli_args(tmp_path, out, "--context-tokens", "64", "--methods", "legolink-2", "--answer-tokens", "4")) == 0
    config = json.loads(out.read_text())["config"]
    assert config["weights"] == "dense" and config["bandwidth_gb_s"] > 0 and config["decode_limit_tok_s"] > 0
    assert config["peak_rss_mb"] >= config["loaded_peak_rss_mb"] > 0
    assert "answer4_s" in capsys.readouterr().out


def test_plots_without_matplotlib_name_the_pip_extra(tmp_path, monkeypatch, capsys):
    """matplotlib is optional: the command refuses --plot before loading a model, a library call
    raises an ImportError naming the extra; nothing else needs it."""
    from ragpic.cli import main
    from ragpic.eval.plots import plot_bench

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"plot_bench .*matplotlib.*pip install 'ragpic\[notebooks\]'"):
        plot_bench({"config": {"methods": []}, "rows": []}, tmp_path / "b.png")
    assert main(["bench", "--plot", str(tmp_path / "b.png")]) == 2
    assert "pip install 'ragpic[notebooks]'" in capsys.readouterr().err
