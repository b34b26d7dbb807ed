"""``benchmarks/pool_ruler.py``: ``ragpic eval ruler`` runs measured in parts, pooled into one result."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the scripts' sibling modules

from pool_ruler import pool_results  # noqa: E402

from ragpic.errors import ConfigError  # noqa: E402


def _record(task: str, sample: int, scores: dict[str, float], ttft: dict[str, float]) -> dict:
    """A sample record as run_ruler writes it, with the fields its aggregation reads."""
    return {"task": task, "length": 4096, "sample": sample, "context_tokens": 4000, "methods": {
        m: {"score": s, "same_as_full": float(s == scores["full"]), "tf_kl_vs_full": 0.0 if m == "full" else 0.1,
            "ttft_s": ttft[m], "recomputed_tokens": 4000 if m == "full" else 300} for m, s in scores.items()}}


def _result(methods: list[str], records: list[dict]) -> dict:
    return {"config": {"methods": methods, "seed": 0}, "samples": records}


def test_pool_results_summarises_the_parts_samples_together():
    a = _result(["full", "qr-4", "qr-3"], [_record("vt", i, {"full": 1.0, "qr-4": s, "qr-3": 0.0},
                                                   {"full": 40.0, "qr-4": 4.0, "qr-3": 3.0})
                                           for i, s in enumerate((1.0, 0.5))])
    b = _result(["full", "legolink-16", "qr-4"], [_record("cwe", 0, {"full": 0.5, "legolink-16": 0.1, "qr-4": 0.5},
                                                          {"full": 40.0, "legolink-16": 2.0, "qr-4": 5.0})])
    pooled = pool_results([a, b])
    assert pooled["config"]["methods"] == ["full", "qr-4"]  # what both ran; the rest dropped per sample
    assert [s["task"] for s in pooled["samples"]] == ["vt", "vt", "cwe"]
    assert all(set(s["methods"]) == {"full", "qr-4"} for s in pooled["samples"])
    overall = pooled["overall"]["qr-4"]
    assert overall["samples"] == 3
    assert overall["score"] == pytest.approx(2.0 / 3)
    assert overall["score_ratio_vs_full"] == pytest.approx((1.0 + 0.5 + 0.5) / (1.0 + 1.0 + 0.5))
    assert overall["ttft_ratio_vs_full"] == pytest.approx(10.0)  # the median of 10, 10 and 8
    assert set(pooled["summary"]) == {"vt", "cwe"} and pooled["summary"]["cwe"]["4096"]["qr-4"]["score"] == 0.5
    assert pooled["config"]["parts"] == [a["config"], b["config"]]


def test_pool_results_names_the_part_it_cannot_pool():
    a = _result(["full", "qr-4"], [_record("vt", 0, {"full": 1.0, "qr-4": 1.0}, {"full": 40.0, "qr-4": 4.0})])
    b = _result(["full"], [_record("vt", 1, {"full": 1.0}, {"full": 40.0})])
    with pytest.raises(ConfigError, match=r"result 1 did not run \['qr-4'\]"):
        pool_results([a, b], methods=["qr-4"])
    with pytest.raises(ConfigError, match="results is empty"):
        pool_results([])
    with pytest.raises(ConfigError, match="result 1 is not a run_ruler result"):
        pool_results([a, {"summary": {}}])
    assert pool_results([a, b])["config"]["methods"] == ["full"]
