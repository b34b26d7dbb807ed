"""Scoring against hand-checked cases, prompt helpers, and a tiny end-to-end `ragpic eval`."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ragpic.eval import scoring
from ragpic.eval.data import load_qa, parse_chunking, qa_chunk_ids, template_parts
from ragpic.eval.needle import NEEDLE, chunk_text, insert_needle


# ------------------------------------------------------------------ normalisation, F1, EM
def test_normalize_answer_longbench():
    assert scoring.normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    assert scoring.normalize_answer("An apple a day") == "apple day"
    assert scoring.normalize_answer("theatre") == "theatre"  # articles only as whole words
    assert scoring.normalize_answer("  ") == ""


def test_f1_hand_checked():
    # pred {cat, sat} vs gold {cat, sat, on, mat}: P = 1, R = 1/2 -> F1 = 2/3
    assert scoring.f1_score("the cat sat", "cat sat on mat") == pytest.approx(2 / 3)
    # multiset overlap: x x y vs x y y share one x and one y: P = R = 2/3
    assert scoring.f1_score("x x y", "x y y") == pytest.approx(2 / 3)
    assert scoring.f1_score("Paris", "paris.") == 1.0
    assert scoring.f1_score("london", "paris") == 0.0
    assert scoring.f1_score("", "paris") == 0.0
    assert scoring.f1_score("the", "a") == 0.0  # both normalise to nothing


def test_exact_match_and_max_over_answers():
    assert scoring.exact_match("The Eiffel Tower.", "eiffel tower") == 1.0
    assert scoring.exact_match("Eiffel", "eiffel tower") == 0.0
    golds = ["NYC", "New York City"]
    assert scoring.max_over(scoring.f1_score, "new york", golds) == pytest.approx(0.8)  # P=1, R=2/3
    assert scoring.max_over(scoring.exact_match, "new york city", golds) == 1.0
    assert scoring.max_over(scoring.f1_score, "anything", []) == 0.0


def test_needle_hit():
    assert scoring.needle_hit("Eat a sandwich and sit in Dolores Park.")
    assert not scoring.needle_hit("Eat a sandwich.")


# ------------------------------------------------------------------ logits
def test_kl_hand_checked():
    ref = torch.tensor([0.0, 0.0])
    other = torch.tensor([0.0, math.log(3.0)])  # q = [1/4, 3/4]
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert float(scoring.kl_divergence(ref, other)) == pytest.approx(expected, abs=1e-6)
    assert float(scoring.kl_divergence(other, other + 7.0)) == pytest.approx(0.0, abs=1e-6)  # shift-invariant
    rows = scoring.kl_divergence(torch.stack([ref, ref]), torch.stack([ref, other]))
    assert rows.shape == (2,) and float(rows[0]) == pytest.approx(0.0, abs=1e-7)


def test_top1_and_cosine():
    a = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    b = torch.tensor([[0.0, 5.0, 0.0], [0.0, 1.0, 0.0]])
    assert scoring.top1_agreement(a, b).tolist() == [1.0, 0.0]
    assert scoring.cosine(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])) == pytest.approx(0.0)
    assert scoring.cosine(torch.tensor([1.0, 1.0]), torch.tensor([2.0, 2.0])) == pytest.approx(1.0)


def test_bootstrap_ci():
    assert scoring.bootstrap_ci([0.3] * 10) == (pytest.approx(0.3), pytest.approx(0.3))
    assert scoring.bootstrap_ci([0.7]) == (0.7, 0.7)
    assert all(math.isnan(v) for v in scoring.bootstrap_ci([]))
    vals = [0.0, 1.0] * 50  # mean 0.5, standard error 0.05 -> 95% interval about +-0.1
    lo, hi = scoring.bootstrap_ci(vals, seed=1)
    assert lo < 0.5 < hi
    assert 0.35 < lo < 0.45 and 0.55 < hi < 0.65
    assert scoring.bootstrap_ci(vals, seed=1) == (lo, hi)  # deterministic


def test_wilson_ci_of_a_share_of_hits():
    lo, hi = scoring.wilson_ci([1] * 4 + [0] * 28)  # 4 of 32: the textbook Wilson interval
    assert lo == pytest.approx(0.0497, abs=1e-4) and hi == pytest.approx(0.2807, abs=1e-4)
    assert scoring.wilson_ci([0] * 32) == (0.0, pytest.approx(0.1072, abs=1e-4))  # not zero-width at 0 of n
    lo, hi = scoring.wilson_ci([1] * 32)
    assert lo == pytest.approx(0.8928, abs=1e-4) and hi == 1.0
    assert scoring.wilson_ci([1, 0] * 50, confidence=0.5)[1] < scoring.wilson_ci([1, 0] * 50)[1]
    assert all(math.isnan(v) for v in scoring.wilson_ci([]))


def test_paired_ratio_ci_resamples_both_sides_together():
    den = [1.0, 2.0, 3.0, 4.0] * 10
    ratio, lo, hi = scoring.paired_ratio_ci([0.5 * d for d in den], den)
    assert ratio == pytest.approx(0.5) and lo == pytest.approx(0.5) and hi == pytest.approx(0.5)  # paired: no spread
    noisy = [d * (0.3 if i % 2 else 0.7) for i, d in enumerate(den)]
    ratio, lo, hi = scoring.paired_ratio_ci(noisy, den, seed=3)
    assert lo < ratio < hi and 0.3 < lo and hi < 0.7
    assert scoring.paired_ratio_ci(noisy, den, seed=3) == (ratio, lo, hi)
    assert all(math.isnan(v) for v in scoring.paired_ratio_ci([], []))
    with pytest.raises(ValueError, match="as many"):
        scoring.paired_ratio_ci([1.0], [1.0, 2.0])


def test_median_mean():
    assert scoring.median([3.0, 1.0, 2.0]) == 2.0
    assert scoring.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert scoring.mean([1.0, 2.0]) == 1.5


# ------------------------------------------------------------------ data and prompts
def test_parse_chunking():
    assert parse_chunking("passage") is None
    assert parse_chunking("tokens:512") == 512
    with pytest.raises(ValueError):
        parse_chunking("sentences")


def test_load_qa_and_chunks(tmp_path):
    from tiny import tiny_tokenizer

    data = [{"question": "q?", "answers": ["a"], "ctxs": [{"title": "T", "text": "the quick brown fox"},
                                                          {"title": "", "text": "jumps over the lazy dog"}]}]
    path = tmp_path / "d.json"
    path.write_text(json.dumps(data))
    (ex,) = load_qa(path)
    assert ex.passages == ("T\nthe quick brown fox", "jumps over the lazy dog")
    tok = tiny_tokenizer()
    whole = qa_chunk_ids(tok, ex)
    assert len(whole) == 2
    cut = qa_chunk_ids(tok, ex, passage_tokens=2)
    assert [len(c) for c in cut] == [2, 2]
    split = qa_chunk_ids(tok, ex, chunk_tokens=2)
    assert sum(len(c) for c in split) == sum(len(c) for c in whole) and max(len(c) for c in split) == 2


def test_template_parts_wrap_user_content():
    from tiny import tiny_tokenizer

    before, after = template_parts(tiny_tokenizer(), "SYS")
    assert "SYS" in before and before.endswith("user\n") and after.endswith("assistant\n")


def test_needle_text_helpers():
    from tiny import tiny_tokenizer

    text = "One two three. Four five six. Seven eight nine."
    assert insert_needle(text, 0).startswith(NEEDLE)
    assert insert_needle(text, 1).endswith(NEEDLE)
    mid = insert_needle(text, 0.5)
    assert "Four five six. " + NEEDLE in mid or "One two three. " + NEEDLE in mid
    chunks = chunk_text(tiny_tokenizer(), text * 4, chunk_tokens=5)
    assert "".join(chunks) == text * 4
    assert all(c.rstrip().endswith(".") for c in chunks)


# ------------------------------------------------------------------ end to end (tiny model)
def _tiny_dataset(tmp_path, n=2):
    from tiny import TEXT

    sentences = [s.strip() + "." for s in TEXT.split(".") if s.strip()]
    data = [{"question": "what is the best thing to do in san francisco?", "answers": ["eat a sandwich"],
             "ctxs": [{"title": "", "text": " ".join(sentences[j:j + 2])} for j in range(i, i + 3)]}
            for i in range(n)]
    path = tmp_path / "tiny_qa.json"
    path.write_text(json.dumps(data))
    return path


def test_evaluate_tiny_end_to_end(tmp_path):
    from tiny import tiny_lm

    from ragpic.eval.evaluate import METRIC_KEYS, evaluate_qa, format_table

    lm = tiny_lm("llama")
    examples = load_qa(_tiny_dataset(tmp_path))
    report = evaluate_qa(lm, examples, ["naive", "legolink-0", "legolink-1000", "cacheblend-15"], max_new_tokens=6)
    methods = report.methods
    assert list(methods) == ["full", "naive", "legolink-0", "legolink-1000", "cacheblend-15"]
    for m, agg in methods.items():
        for key in METRIC_KEYS:
            assert key in agg, (m, key)
        assert len(agg["tf_kl_vs_full_ci95"]) == 2
    # full against itself, and legolink with k covering every chunk token: the same prefill
    for m in ("full", "legolink-1000"):
        assert methods[m]["tf_kl_vs_full"] == pytest.approx(0.0, abs=1e-4)
        assert methods[m]["tf_top1_vs_full"] == 1.0 and methods[m]["top1_vs_full"] == 1.0
        assert methods[m]["cos_vs_full"] == pytest.approx(1.0, abs=1e-5)
        assert methods[m]["f1_vs_full"] == 1.0 and methods[m]["same_as_full"] == 1.0
    # the others link the template's head from full's rows (the engine's prefix cache): exact, fewer rows
    assert methods["legolink-1000"]["recomputed_tokens"] < methods["full"]["recomputed_tokens"]
    plain = evaluate_qa(lm, examples[:1], ["legolink-1000"], max_new_tokens=6, prefix_cache=False).methods
    assert plain["legolink-1000"]["recomputed_tokens"] == plain["full"]["recomputed_tokens"]
    assert plain["legolink-1000"]["tf_kl_vs_full"] == pytest.approx(0.0, abs=1e-4)
    assert methods["naive"]["recomputed_tokens"] < methods["full"]["recomputed_tokens"]
    assert methods["naive"]["tf_kl_vs_full"] > 1e-3  # random weights: stale chunks do differ
    assert methods["full"]["ttft_ratio_vs_full"] == pytest.approx(1.0)
    # every method but full and naive gets its KL as a share of naive's, paired over questions
    assert "tf_kl_ratio_vs_naive" not in methods["full"] and "tf_kl_ratio_vs_naive" not in methods["naive"]
    assert methods["legolink-1000"]["tf_kl_ratio_vs_naive"] == pytest.approx(0.0, abs=1e-3)
    lo, hi = methods["cacheblend-15"]["tf_kl_ratio_vs_naive_ci95"]
    assert lo <= methods["cacheblend-15"]["tf_kl_ratio_vs_naive"] <= hi
    assert "legolink-1000" in format_table(methods) and "paired bootstrap" in format_table(methods)
    back = json.loads(json.dumps(report.to_json(), allow_nan=False))  # strict JSON, as other tools read it
    assert back["methods"] == methods and back["config"]["methods"] == list(methods)
    assert [q["question"] for q in back["questions"]] == [e.question for e in examples]
    assert all(set(q["methods"]) == set(methods) for q in back["questions"])
    for m in methods:  # answer identity: the share of questions whose normalised answer is full's
        same = [scoring.normalize_answer(q["methods"][m]["answer"]) == scoring.normalize_answer(
            q["methods"]["full"]["answer"]) for q in back["questions"]]
        assert methods[m]["same_as_full"] == pytest.approx(sum(same) / len(same)), m
        assert methods[m]["same_as_full_ci95"] == list(scoring.wilson_ci(same)), m
    assert "same" in format_table(methods).splitlines()[0] and "Wilson 95% CI" in format_table(methods)


def test_cli_eval_and_needle_on_a_saved_tiny_model(tmp_path, capsys):
    from tiny import TEXT, saved_tiny_model

    from ragpic.cli import main

    model_dir = saved_tiny_model(tmp_path / "tiny-model")
    out = tmp_path / "eval.json"
    rc = main(["eval", "--dataset", str(_tiny_dataset(tmp_path, 1)), "--model", str(model_dir), "--device", "cpu",
               "--methods", "naive,legolink-2", "--chunking", "tokens:8", "--max-new-tokens", "4", "--json",
               str(out), "--plot", str(tmp_path / "eval.png"), "--quiet"])
    assert rc == 0
    data = json.loads(out.read_text())
    assert set(data["methods"]) == {"full", "naive", "legolink-2"}
    assert "tf_kl" in capsys.readouterr().out
    assert (tmp_path / "eval.png").exists()

    hay = tmp_path / "hay"
    hay.mkdir()
    (hay / "a.txt").write_text(TEXT * 6)
    nout = tmp_path / "needle.json"
    rc = main(["eval", "needle", "--haystack", str(hay), "--model", str(model_dir), "--device", "cpu",
               "--lengths", "400,700", "--depths", "0,1", "--methods", "naive,legolink-4,qr-50", "--chunk-tokens", "48",
               "--max-new-tokens", "4", "--json", str(nout), "--plot", str(tmp_path / "needle.png"), "--quiet"])
    assert rc == 0
    res = json.loads(nout.read_text())
    assert len(res["cells"]) == 2 * 2 * 4
    assert (tmp_path / "needle.png").exists() and (tmp_path / "needle-legolink-4.png").exists()
    assert res["summary"]["full"]["tf_kl_vs_full"] == pytest.approx(0.0, abs=1e-4)
    assert res["summary"]["full"]["ttft_ratio_vs_full"] == 1.0
    full_answer = {(c["length"], c["depth"]): c["answer"] for c in res["cells"] if c["method"] == "full"}
    for m in ("full", "naive", "legolink-4", "qr-50"):  # answer identity with full, per cell and summed up
        mine = [c for c in res["cells"] if c["method"] == m]
        for c in mine:
            assert c["same_as_full"] == scoring.exact_match(c["answer"], full_answer[(c["length"], c["depth"])])
        assert res["summary"][m]["same_as_full"] == pytest.approx(sum(c["same_as_full"] for c in mine) / len(mine))
        assert res["summary"][m]["same_as_full_ci95"] == list(scoring.wilson_ci([c["same_as_full"] for c in mine]))
    assert res["summary"]["full"]["same_as_full"] == 1.0
    by = {(c["length"], c["depth"], c["method"]): c["ttft_s"] for c in res["cells"]}
    for m in ("naive", "legolink-4", "qr-50"):  # the median over cells of full's link time / the method's
        ratios = sorted(by[(n, d, "full")] / by[(n, d, m)] for n in (400, 700) for d in (0, 1))
        assert res["summary"][m]["ttft_ratio_vs_full"] == pytest.approx((ratios[1] + ratios[2]) / 2)
    assert "speed-up" in capsys.readouterr().out


def test_int8_variant_links_quantized_kv(tmp_path):
    from tiny import tiny_lm

    from ragpic.eval.evaluate import evaluate_qa, normalize_methods

    assert normalize_methods("naive@int8,legolink-16") == ["full", "naive@int8", "legolink-16"]
    with pytest.raises(ValueError, match="'@int8' or '@int4'"):
        normalize_methods("naive@fp4")
    lm = tiny_lm("llama")
    report = evaluate_qa(lm, load_qa(_tiny_dataset(tmp_path)),
                         ["naive", "naive@int8", "naive@int4", "legolink-1000@int8", "legolink-1000@int4"],
                         max_new_tokens=4)
    m = report.methods
    # the quantized KV was really linked: naive's KL moves, less with int8's 256 levels than with
    # int4's 16, and int8 keeps it within 5% (a wrong scale or codec would move it far more)
    shift = {q: abs(m[f"naive@{q}"]["tf_kl_vs_full"] - m["naive"]["tf_kl_vs_full"]) for q in ("int8", "int4")}
    assert 0 < shift["int8"] < shift["int4"] and shift["int8"] < 0.05 * m["naive"]["tf_kl_vs_full"], shift
    for q in ("int8", "int4"):
        # with every chunk token recomputed, stored KV (quantized or not) no longer matters
        assert m[f"legolink-1000@{q}"]["tf_kl_vs_full"] == pytest.approx(0.0, abs=1e-4)
