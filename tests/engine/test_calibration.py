"""``method="auto"`` and ``ragpic calibrate`` (:mod:`ragpic.engine.calibration`, :mod:`ragpic.eval.calibrate`)
on tiny random models and hand-made calibrations."""

from __future__ import annotations

import json
import logging

import pytest

from ragpic import Config, RagPic
from ragpic.core.link import linker_for
from ragpic.core.methods import parse_method
from ragpic.engine.calibration import FALLBACK, Calibration, RecipeScore, choose
from ragpic.engine.calibration_file import calibration_path, load_calibration, save_calibration
from ragpic.errors import ConfigError, LinkError
from tiny import tiny_lm

FP = "llama:float32:0123abcd:4567ef89"


def calibration(fp: str = FP) -> Calibration:
    """full does vt and niah but not cwe; qp-10 keeps 98% everywhere at 8x, legolink-16 90% at 20x,
    qr-10 100% at 4x."""
    full = {"vt": 0.9, "niah": 1.0, "cwe": 0.2}
    return Calibration(fp, "tiny", full, [
        RecipeScore("legolink-16", {"vt": 0.90, "niah": 1.0, "cwe": 0.0}, 20.0),
        RecipeScore("qp-10", {"vt": 0.98, "niah": 0.99, "cwe": 0.5}, 8.0),
        RecipeScore("qr-10", {"vt": 1.0, "niah": 1.0, "cwe": None}, 4.0),
    ], {"seed": 1})


def test_auto_picks_the_fastest_recipe_that_keeps_the_fidelity_on_every_task_full_can_do():
    cal = calibration()
    assert cal.tasks_full_can_do() == ["vt", "niah"]  # cwe's shares do not count
    assert choose(cal, 0.97).method.name == "qp-10"
    assert choose(cal, 0.99).method.name == "qr-10"
    assert choose(cal, 0.9).method.name == "legolink-16"
    picked = choose(cal, 0.97, probe_runs=False)  # this model cannot run qr or qp: legolink-16 is all it has
    assert picked.method.name == "legolink-16" and picked.calibrated and "comes closest" in picked.reason
    closest = choose(Calibration(FP, "t", {"vt": 1.0}, [RecipeScore("legolink-16", {"vt": 0.5}, 20.0),
                                                        RecipeScore("qp-5", {"vt": 0.8}, 9.0)]), 0.97)
    assert closest.method.name == "qp-5" and "no recipe in its calibration keeps 97%" in closest.reason
    assert "method='full'" in closest.reason
    fallback = choose(None, 0.97)
    assert fallback.method.name == FALLBACK and not fallback.calibrated and "ragpic calibrate" in fallback.reason
    # the fallback reads the question's attention: a model that cannot run it gets the fast preset
    assert choose(None, 0.97, probe_runs=False).method.name == "fast"


def test_a_calibration_round_trips_and_is_read_as_checked_data(tmp_path):
    path = save_calibration(calibration(), tmp_path)
    assert path == calibration_path(FP, tmp_path) and path.parent == tmp_path / "calibration"
    assert ":" not in path.name and path.suffix == ".json"
    assert load_calibration(FP, tmp_path) == calibration()
    assert load_calibration("other:fp", tmp_path) is None  # another model: none of its own
    raw = json.loads(path.read_text())
    row = raw["recipes"][0]
    assert row["name"] == "legolink-16" and row["recipe"]["kind"] == "legolink" and row["recipe"]["k"] == 16
    v1 = {k: v for k, v in row.items() if k not in ("name", "recipe")}  # a version-1 row: its spelling alone

    def named(method):
        return {**raw, "version": 1, "recipes": [{**v1, "method": method}]}

    for bad, words in [({**raw, "fingerprint": "x"}, "calibrates 'x'"),
                       ({**raw, "version": 99}, "version-1"),
                       (named("__import__('os')"), "unknown link method"),
                       ({**raw, "recipes": [{**row, "recipe": {"kind": "__import__('os')"}}]}, "unknown link method"),
                       ({**raw, "recipes": [{**row, "recipe": {**row["recipe"], "k": "16"}}]}, "do not spell"),
                       ({**raw, "recipes": [{**row, "recipe": {**row["recipe"], "code": "x"}}]}, "only the fields"),
                       ({**raw, "recipes": [{**row, "speedup": "fast"}]}, "recipes[0].speedup"),
                       ({**raw, "recipes": []}, "no recipes"),
                       (named("qp-10@int8"), "'@prev<m>' variants only"),
                       (named("legolink-0@prev2"), "drop '@prev2'"),
                       (named("qp-10@chat"), "'@prev<m>' variants only")]:
        path.write_text(json.dumps(bad))
        with pytest.raises(ConfigError, match="ragpic calibrate") as err:
            load_calibration(FP, tmp_path)
        assert str(path) in str(err.value) and words in str(err.value)
    path.write_text(json.dumps(named("qp-10")))  # a version-1 file is still read
    assert [r.name for r in load_calibration(FP, tmp_path).recipes] == ["qp-10"]
    path.write_bytes(b"\x80not json")
    with pytest.raises(ConfigError, match="unusable"):
        load_calibration(FP, tmp_path)


def test_fidelity_and_auto_are_checked_where_they_are_given():
    for bad in (0, 1.5, "0.9", float("nan"), True):
        with pytest.raises(ConfigError, match="fidelity"):
            Config(fidelity=bad)
    assert Config(method="auto").method == "auto" and parse_method("AUTO").name == "auto"
    with pytest.raises(LinkError, match="Engine"):
        linker_for("auto")
    with pytest.raises(ConfigError, match="resolved"):
        parse_method("auto").recipe


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGPIC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _engine(tmp_path, **config):
    lm = tiny_lm("llama", num_hidden_layers=3)
    lm.model.generation_config.eos_token_id = None
    return RagPic(Config(store=str(tmp_path / "kv"), max_new_tokens=4, **config), lm=lm)


PASSAGES = ["the quick brown fox jumps over the lazy dog near the park.", "answer: eat a sandwich and sit in the sun."]
PROMPT = "passages:\n" + "\n\n".join(PASSAGES) + "\n\nquestion: what is the best thing to do?"


def test_auto_without_a_calibration_links_with_the_fallback_and_says_so_once(tmp_path, home, caplog):
    engine = _engine(tmp_path, method="auto")
    with caplog.at_level(logging.INFO, logger="ragpic.engine"):
        a = engine.generate(PROMPT, hints=PASSAGES)
        b = engine.generate(PROMPT, hints=PASSAGES, method="auto")
    said = [r for r in caplog.records if "auto:" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING and FALLBACK in said[0].getMessage()
    explicit = engine.generate(PROMPT, hints=PASSAGES, method=FALLBACK)
    assert a.method == b.method == FALLBACK and a.token_ids == b.token_ids == explicit.token_ids


def test_auto_links_with_the_models_calibrated_choice(tmp_path, home, caplog):
    engine = _engine(tmp_path, method="auto", fidelity=0.97)
    cal = calibration(engine.lm.fingerprint)
    save_calibration(cal, home)
    with caplog.at_level(logging.INFO, logger="ragpic.engine"):
        g = engine.generate(PROMPT, hints=PASSAGES)
    assert engine.auto_choice().method.name == g.method == "qp-10"
    assert any(r.levelno == logging.INFO and "qp-10 is the fastest" in r.getMessage() for r in caplog.records)
    assert g.token_ids == engine.generate(PROMPT, hints=PASSAGES, method="experimental:qp-10").token_ids
    # the chunks are stored under the recipe auto resolved to
    assert engine.chunk_key(PASSAGES[0], "auto") == engine.chunk_key(PASSAGES[0], "experimental:qp-10")
    strict = _engine(tmp_path, method="auto", fidelity=1.0)  # only qr-10 keeps 100%: slower, chosen
    assert strict.method_of().name == "qr-10"


def behind_calibration(fp: str = FP) -> Calibration:
    """``calibration()`` plus two recipes on chunks compiled behind two: legolink-16@chat@prev2 keeps
    98% at 20x (no task measured where it was not run: the QA task), qp-10@prev2 100% at 8x."""
    cal = calibration(fp)
    return Calibration(fp, "tiny", {**cal.full_scores, "qa": 0.8}, cal.recipes + [
        RecipeScore("legolink-16@chat@prev2", {"vt": 0.98, "niah": 1.0, "cwe": 0.4}, 20.0),
        RecipeScore("qp-10@prev2", {"vt": 1.0, "niah": 1.0, "cwe": 0.5}, 8.0),
    ], {"seed": 1, "behind": 2})


def test_auto_on_chunks_compiled_behind_picks_among_their_own_rows(tmp_path):
    cal = behind_calibration()
    # chunks alone: the @prev rows are not candidates (qp-10 has no qa share: it was not run there)
    assert choose(cal, 0.97).method.name == "qp-10"
    picked = choose(cal, 0.97, behind=True)
    assert picked.method.name == "legolink-16" and "legolink-16@chat@prev2 is the fastest" in picked.reason
    assert picked.reason.startswith("auto (chunks compiled behind the ones before)")
    assert choose(cal, 0.99, behind=True).method.name == "qp-10"
    assert cal.worst_share(cal.recipes[3]) == pytest.approx(0.98)  # qa absent from its shares: not a zero
    # a calibration without @prev rows answers as for chunks alone
    assert choose(calibration(), 0.97, behind=True).method.name == "qp-10"
    assert load_calibration(FP, save_calibration(cal, tmp_path).parent.parent) == cal


def test_auto_links_a_prompt_in_document_order_with_the_behind_choice(tmp_path, home):
    doc = ["the quick brown fox jumps over the lazy dog near the park.",
           "a needle hides in the haystack near dolores park today.",
           "answer: eat a sandwich and sit in the sun by the water."]
    engine = _engine(tmp_path, method="auto", fidelity=0.97, compile_behind=2, kv_quant="none")
    save_calibration(behind_calibration(engine.lm.fingerprint), home)
    engine.compile(doc, in_order=True)
    in_order = "passages:\n" + "\n\n".join(doc) + "\n\nquestion: what is the best thing to do?"
    g = engine.generate(in_order, hints=doc)
    assert (g.chunks_behind, g.method) == (2, "legolink-16")
    assert g.token_ids == engine.generate(in_order, hints=doc, method="legolink-16").token_ids
    reversed_ = "passages:\n" + "\n\n".join(doc[::-1]) + "\n\nquestion: what is the best thing to do?"
    r = engine.generate(reversed_, hints=doc)
    assert (r.chunks_behind, r.method) == (0, "qp-10")  # chunks alone: the plain choice
    # a method named by the caller is never swapped
    assert engine.generate(in_order, hints=doc, method="experimental:qp-10").method == "qp-10"
