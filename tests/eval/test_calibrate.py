"""``ragpic calibrate`` (:mod:`ragpic.eval.calibrate`) on tiny random models: what ``auto`` reads
(its choice and the engine's use of it: tests/engine/test_calibration.py)."""

from __future__ import annotations

import json

import pytest

from ragpic.engine.calibration_file import load_calibration, save_calibration
from test_eval import _tiny_dataset
from tiny import tiny_lm


def test_run_calibration_measures_every_recipe_against_full(tmp_path):
    from ragpic.eval.calibrate import format_calibration, run_calibration
    from ragpic.eval.data import load_qa

    lm = tiny_lm("llama")
    cal = run_calibration(lm, recipes=["NAIVE", "legolink-100000", "qp-100-k16"], tasks=["niah_single", "vt"],
                          lengths=[700], samples=1, chunk_tokens=128, max_new_tokens=3,
                          qa=load_qa(_tiny_dataset(tmp_path)))
    assert cal.fingerprint == lm.fingerprint and list(cal.full_scores) == ["niah_single", "vt", "qa"]
    assert [r.name for r in cal.recipes] == ["naive", "legolink-100000", "qp-100"]  # canonical names
    for r in cal.recipes:
        assert set(r.shares) == set(cal.full_scores) and r.speedup > 0
        if r.name != "naive":  # every row recomputed: full's answers, so full's score wherever it has one
            assert all(s == pytest.approx(1.0) for t, s in r.shares.items() if cal.full_scores[t] > 0)
            assert all(s is None for t, s in r.shares.items() if cal.full_scores[t] == 0)
    table = format_calibration(cal, 0.97)
    assert all(r.name in table for r in cal.recipes) and "auto:" in table
    assert load_calibration(lm.fingerprint, tmp_path) is None
    save_calibration(cal, tmp_path)
    assert load_calibration(lm.fingerprint, tmp_path) == cal


def test_cli_calibrate_writes_where_auto_looks(tmp_path, capsys):
    from tiny import saved_tiny_model

    from ragpic.cli import main
    from ragpic.cli.calibrate import DEFAULT_RECIPES
    from ragpic.core.model import load_model
    from ragpic.eval.calibrate import DEFAULT_RECIPES as RECIPES

    assert DEFAULT_RECIPES.split(",") == list(RECIPES)
    model_dir = saved_tiny_model(tmp_path / "tiny-model")
    out = tmp_path / "cal.json"
    rc = main(["calibrate", "--model", str(model_dir), "--device", "cpu", "--tasks", "niah_single", "--lengths", "1024",
               "--samples", "1", "--musique", "0", "--recipes", "naive,legolink-100000", "--dir", str(tmp_path / "c"),
               "--json", str(out), "--quiet"])
    assert rc == 0
    io = capsys.readouterr()
    assert "legolink-100000" in io.out and "auto:" in io.out
    fp = load_model(str(model_dir), device="cpu").fingerprint
    saved = load_calibration(fp, tmp_path / "c")
    assert [r.name for r in saved.recipes] == ["naive", "legolink-100000"]
    assert json.loads(out.read_text())["fingerprint"] == fp


def test_cli_calibrate_compile_behind_adds_each_recipe_on_chunks_compiled_behind(tmp_path, capsys):
    from tiny import saved_tiny_model

    from ragpic.cli import main
    from ragpic.core.model import load_model

    model_dir = saved_tiny_model(tmp_path / "tiny-model")
    rc = main(["calibrate", "--model", str(model_dir), "--device", "cpu", "--tasks", "niah_single", "--lengths", "1024",
               "--samples", "1", "--musique", "0", "--recipes", "naive,legolink-100000", "--compile-behind", "8", "--compile-head", "chat",
               "--dir", str(tmp_path / "c"), "--quiet"])
    assert rc == 0
    io = capsys.readouterr()
    assert "auto (chunks compiled behind the ones before):" in io.out
    saved = load_calibration(load_model(str(model_dir), device="cpu").fingerprint, tmp_path / "c")
    assert [r.name for r in saved.recipes] == ["naive", "legolink-100000", "naive@chat@prev8",
                                                 "legolink-100000@chat@prev8"]
    assert [r.behind for r in saved.recipes] == [0, 0, 8, 8] and saved.setup["behind"] == 8
    assert saved.recipes[3].recipe.method.name == "legolink-100000"
    # the rows on chunks compiled behind are measured on the same RULER tasks
    naive, behind = saved.recipes[0], saved.recipes[2]
    assert set(behind.shares) == set(naive.shares) == {"niah_single"}
    for bad, words in ((["--compile-behind", "17"], "at most 16"), (["--recipes", "legolink-0", "--compile-behind", "2"],
                                                                    "drop '@prev2'")):
        assert main(["calibrate", "--model", str(model_dir), *bad]) == 2
        assert words in capsys.readouterr().err
