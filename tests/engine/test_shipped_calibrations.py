"""The calibrations that ship inside the package (:mod:`ragpic.engine.calibration_file`) and the
public method names (:mod:`ragpic.core.methods`): ``auto`` by default, resolved with no calibration run."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

from ragpic import Config, RagPic
from ragpic.core.methods import PRESETS, parse_method
from ragpic.engine.calibration import FALLBACK, choose
from ragpic.engine.calibration_file import find_calibration, save_calibration, shipped_calibrations
from ragpic.errors import ConfigError
from ragpic.models.registry import MODELS
from tiny import tiny_lm


def test_the_public_names_are_few_and_the_rest_is_marked_experimental():
    assert Config().method == "auto" and list(PRESETS) == ["fast", "balanced", "faithful"]
    for name in ("auto", "full", "naive", "legolink-16", "legolink-0", *PRESETS):
        assert not parse_method(name).experimental and Config(method=name).method == name
    assert parse_method("balanced").name == "balanced" and parse_method("balanced").spelled == PRESETS["balanced"].recipe
    assert parse_method("fast") == parse_method("legolink-16")  # the same recipe, named two ways
    for bare in ("qr-10", "qp-5-d25", "cacheblend-15", "qr-4-k4-h1-w-s"):
        with pytest.raises(ConfigError, match=f"write 'experimental:{bare}'"):
            Config(method=bare)
        m = parse_method(f"experimental:{bare}")
        assert m.experimental and m.name == bare and Config(method=f"experimental:{bare}")
    with pytest.raises(ConfigError, match="unknown link method 'quick'.*fast, balanced, faithful"):
        Config(method="quick")


def test_a_calibration_ships_for_every_model_ragpic_installs():
    from ragpic.core.gguf import known_sha256
    from ragpic.paths import default_gguf

    shipped = shipped_calibrations()
    want = {m.sha256: m.name for m in MODELS.values()}
    if default_gguf() is not None:
        want[known_sha256(default_gguf())] = "smollm2-135m"
    assert set(want) <= set(shipped), "a model ragpic installs has no shipped calibration"
    for sha, cal in shipped.items():
        assert cal.model == want[sha]
        assert {r.name for r in cal.recipes} <= set(PRESETS), "auto chooses among the presets only"
        assert all(cal.made.get(k) for k in ("command", "machine", "date")), cal.model
        assert cal.setup.get("seed") == 20261204  # the calibration seed, never an evaluation's (seed 0)
        assert choose(cal, Config().fidelity, where="it").calibrated


def test_every_weights_format_of_a_shipped_model_finds_its_calibration(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGPIC_HOME", str(tmp_path / "home"))
    sha = MODELS["qwen2.5-coder-1.5b"].sha256
    lm = dataclasses.replace(tiny_lm("llama", num_hidden_layers=2), source_sha256=sha)
    cal, where = find_calibration(lm.fingerprint, lm.source_sha256)
    assert cal is shipped_calibrations()[sha] or cal == shipped_calibrations()[sha]
    assert where == "the calibration shipped for qwen2.5-coder-1.5b"
    other_format = dataclasses.replace(lm, fingerprint=lm.fingerprint.replace("float32", "bfloat16+int4"))
    assert find_calibration(other_format.fingerprint, sha)[0] == cal  # keyed by the file, not the format
    engine = RagPic(Config(), lm=lm)
    assert engine.auto_choice().calibrated and "shipped for qwen2.5-coder-1.5b" in engine.auto_choice().reason
    # the user's own run of this very model (fingerprint) wins over the shipped one
    mine = dataclasses.replace(cal, fingerprint=lm.fingerprint, recipes=cal.recipes[:1])
    save_calibration(mine, tmp_path / "home")
    own, where = find_calibration(lm.fingerprint, sha)
    assert own == mine and where.startswith("your calibration")
    assert RagPic(Config(), lm=lm).method_of().name == mine.recipes[0].name


def test_a_model_without_one_links_with_the_fallback_and_says_the_command_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("RAGPIC_HOME", str(tmp_path / "home"))
    engine = RagPic(Config(), lm=tiny_lm("llama", num_hidden_layers=2))
    with caplog.at_level(logging.INFO, logger="ragpic.engine"):
        assert engine.method_of().name == FALLBACK == engine.method_of().name
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("auto:")]
    assert len(said) == 1 and "ragpic calibrate --model" in said[0] and PRESETS[FALLBACK].recipe in said[0]


def test_the_shipped_files_are_data_checked_field_by_field():
    from importlib import resources

    from ragpic.engine.calibration_file import read_calibration

    for entry in resources.files("ragpic").joinpath("data", "calibrations").iterdir():
        raw = json.loads(entry.read_text())
        assert raw["version"] == 2 and all(set(r) == {"name", "recipe", "shares", "speedup"} for r in raw["recipes"])
        bad = {**raw, "recipes": [{**raw["recipes"][0], "recipe": {**raw["recipes"][0]["recipe"], "kind": "eval"}}]}
        with pytest.raises(ValueError, match="unknown link method 'eval'"):
            read_calibration(bad)


def test_the_embedded_model_resolves_auto_from_its_shipped_calibration(smol, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("RAGPIC_HOME", str(tmp_path / "home"))  # no calibration run of the user's
    assert len(smol.source_sha256) == 64
    engine = RagPic(Config(), lm=smol)
    with caplog.at_level(logging.INFO, logger="ragpic.engine"):
        choice = engine.auto_choice()
    assert choice.calibrated and "shipped for smollm2-135m" in choice.reason
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "auto:" in r.getMessage()]
    assert choice.method.name in PRESETS
