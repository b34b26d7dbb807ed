"""``benchmarks/bench_peers.py``: ``ragpic bench`` with reference prefills beside the methods (plain
transformers, llama.cpp), and ``benchmarks/llamacpp_bench.py``'s llama-bench runner on a stand-in binary."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the scripts' sibling modules

import bench_peers  # noqa: E402
import llamacpp_bench  # noqa: E402


def test_bench_times_the_hf_generate_peer_on_fulls_ids_and_restores_the_attention():
    """A reference prefill outside ragpic (docs/RESULTS.md §8), in the same rotation as the methods."""
    from tiny import TEXT, tiny_lm

    from ragpic.eval.bench import format_table, run_bench

    lm = tiny_lm("llama")
    calls = []
    hf = bench_peers.hf_generate(lm)

    def peer(ids):
        calls.append(list(ids))
        assert lm.model.config._attn_implementation == "ragpic_sdpa"  # switched only inside the call
        return hf(ids)

    res = run_bench(lm, text=TEXT * 8, context_tokens=[96], chunk_tokens=32, query_tokens=8, repeats=3,
                    methods=["legolink-4"], measure_memory=False, peers={"hf-generate": peer})
    by = {r["method"]: r for r in res["rows"]}
    assert set(by) == {"full", "legolink-4", "hf-generate"} and res["config"]["peers"] == ["hf-generate"]
    assert len(calls) == 1 + 3 and all(len(c) == 96 for c in calls)  # a warm-up, then one per repeat
    assert by["hf-generate"]["recomputed_tokens"] == 96 and by["hf-generate"]["flop_limit_ratio"] == 1.0
    assert by["hf-generate"]["ttft_median_s"] > 0 and "hf-generate" in format_table(res)
    assert lm.model.config._attn_implementation == "ragpic_sdpa" and lm.banded_attention


def test_the_script_runs_ragpic_bench_with_a_peer(tmp_path, capsys):
    from tiny import TEXT, saved_tiny_model

    hay = tmp_path / "hay"
    hay.mkdir()
    (hay / "a.txt").write_text(TEXT * 4)
    out = tmp_path / "bench.json"
    assert bench_peers.main(["--haystack", str(hay), "--model", str(saved_tiny_model(tmp_path / "m")),
                             "--device", "cpu", "--chunk-tokens", "32", "--query-tokens", "8", "--repeats", "1",
                             "--no-memory", "--json", str(out), "--quiet", "--context-tokens", "64",
                             "--methods", "naive", "--peers", "hf-generate"]) == 0
    data = json.loads(out.read_text())
    assert {r["method"] for r in data["rows"]} == {"full", "naive", "hf-generate"}
    assert data["config"]["peers"] == ["hf-generate"] and "hf-generate" in capsys.readouterr().out


def test_the_script_refuses_an_unknown_or_missing_peer_and_ragpic_bench_has_none(capsys):
    from ragpic.cli import main

    assert bench_peers.main(["--peers", "vllm"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python benchmarks/bench_peers.py: error:") and "unknown peer 'vllm'" in err
    if importlib.util.find_spec("llama_cpp") is None:
        assert bench_peers.main(["--peers", "llama.cpp"]) == 2
        assert "llama-cpp-python is not installed" in capsys.readouterr().err
    assert main(["bench", "--peers", "hf-generate"]) == 2  # the user command times ragpic's methods only
    assert "unrecognized arguments: --peers" in capsys.readouterr().err


FAKE_LLAMA_BENCH = """\
import json, sys
a = dict(zip(sys.argv[1::2], sys.argv[2::2]))
p, n = int(a["-p"]), int(a["-n"])
print(json.dumps([{"n_prompt": p, "n_gen": n, "n_depth": int(a["-d"]), "avg_ts": 100.0 if n == 0 else 20.0,
                   "stddev_ts": 1.0, "samples_ts": [99.0, 101.0], "n_threads": int(a["-t"]),
                   "build_commit": "abc", "build_number": 1, "model_type": "tiny Q4_K"}]))
"""


def test_llamacpp_answer_reads_llama_bench_json(tmp_path, monkeypatch):
    """The runner's command line and JSON reading, on a stand-in for the llama-bench binary."""
    binary = tmp_path / "llama-bench"
    binary.write_text(f"#!{sys.executable}\n{FAKE_LLAMA_BENCH}")
    binary.chmod(0o755)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv("RAGPIC_LLAMA_BENCH", str(binary))
    assert llamacpp_bench.find_llama_bench() == binary
    row = llamacpp_bench.llamacpp_answer(str(gguf), 400, 9, threads=2, repeats=2)
    assert row["method"] == "llama.cpp" and row["pp_tok_s"] == 100.0 and row["decode_tok_s"] == 20.0
    assert row["ttft_median_s"] == pytest.approx(4.0) and row["answer_median_s"] == pytest.approx(4.0 + 8 / 20)
    assert row["llama_cpp_build"] == "abc (1)" and row["llama_cpp_type"] == "tiny Q4_K"
    monkeypatch.setenv("RAGPIC_LLAMA_BENCH", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="RAGPIC_LLAMA_BENCH"):  # a ConfigError
        llamacpp_bench.find_llama_bench()
