"""``benchmarks/plots.py``: the research figures over several runs' JSON (fidelity vs speed-up)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the scripts' sibling modules

from plots import fidelity_points, plot_fidelity, plot_pareto  # noqa: E402


def test_fidelity_points_are_each_evaluations_ratio_to_full(tmp_path):
    needle = {"summary": {"full": {"ttft_ratio_vs_full": 1.0, "hits_where_full_hits": 8, "full_hit_cells": 8},
                          "naive": {"ttft_ratio_vs_full": 30.0, "hits_where_full_hits": 6, "full_hit_cells": 8}}}
    musique = {"methods": {"full": {"ttft_ratio_vs_full": 1.0, "same_as_full": 1.0},
                           "naive": {"ttft_ratio_vs_full": 12.0, "same_as_full": 0.25}}}
    ruler = {"overall": {"naive": {"ttft_ratio_vs_full": 35.0, "score_ratio_vs_full": 0.6,
                                   "score_ratio_vs_full_ci95": [0.4, 0.9]}}}
    pts = fidelity_points(needle, musique, ruler)
    assert pts["needle"]["naive"] == (30.0, 0.75, None)
    assert pts["MuSiQue"]["naive"] == (12.0, 0.25, None)
    assert pts["RULER"]["naive"] == (35.0, 0.6, [0.4, 0.9])
    assert list(fidelity_points(ruler=ruler)) == ["RULER"]
    # a report from before answer identity was summarised: taken from its per-question answers
    older = {"methods": {"full": {"ttft_ratio_vs_full": 1.0}, "naive": {"ttft_ratio_vs_full": 9.0}},
             "questions": [{"methods": {"full": {"answer": "Exeter College."}, "naive": {"answer": "exeter college"}}},
                           {"methods": {"full": {"answer": "Paris"}, "naive": {"answer": "Rome"}}}]}
    assert fidelity_points(musique=older)["MuSiQue"]["naive"] == (9.0, 0.5, None)
    assert plot_fidelity("tiny", pts, tmp_path / "f.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="at least one"):
        plot_fidelity("tiny", {}, tmp_path / "g.png")


def test_plot_pareto_draws_either_run_or_both(tmp_path):
    musique = {"config": {"questions": 2}, "methods": {
        "full": {"ttft_ratio_vs_full": 1.0, "tf_kl_vs_full": 0.0, "tf_kl_vs_full_ci95": [0.0, 0.0]},
        "naive": {"ttft_ratio_vs_full": 30.0, "tf_kl_vs_full": 0.4, "tf_kl_vs_full_ci95": [0.3, 0.5]}}}
    needle = {"summary": {"full": {"ttft_ratio_vs_full": 1.0, "hits_where_full_hits": 8, "full_hit_cells": 8},
                          "naive": {"ttft_ratio_vs_full": 30.0, "hits_where_full_hits": 6, "full_hit_cells": 8}}}
    assert plot_pareto(musique, needle, tmp_path / "p.png").stat().st_size > 1000
    assert plot_pareto(None, needle, tmp_path / "n.png").exists()
    with pytest.raises(ValueError, match="an eval report, a needle result, or both"):
        plot_pareto(None, None, tmp_path / "x.png")
