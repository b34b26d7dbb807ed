"""``ragpic eval ruler``: the generated set (seeded, sized, solvable from its text), RULER's
scoring on hand-made answers, and an end-to-end CLI run on a tiny random model."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from ragpic.eval import scoring
from ragpic.eval.data import default_haystack, load_haystack
from ragpic.eval.ruler_tasks import TASKS, generate_sample, generate_set
from ragpic.eval.ruler_text import token_count

LENGTHS, CHUNK = (700, 1000), 128  # the tiny model's window is 1024 positions


@pytest.fixture(scope="module")
def tok():
    from tiny import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture(scope="module")
def haystack() -> str:
    return load_haystack(default_haystack())


@pytest.fixture(scope="module")
def samples(tok, haystack):
    return generate_set(tok, haystack, list(TASKS), LENGTHS, 2, seed=0, chunk_tokens=CHUNK)


def _context(sample) -> str:
    return "".join(c.text for c in sample.chunks)


# ------------------------------------------------------------------ the generated set
def test_same_seed_same_set_other_seed_other_set(tok, haystack, samples):
    again = generate_set(tok, haystack, list(TASKS), LENGTHS, 2, seed=0, chunk_tokens=CHUNK)
    assert again == samples
    other = generate_set(tok, haystack, list(TASKS), LENGTHS, 2, seed=1, chunk_tokens=CHUNK)
    for a, b in zip(samples, other):
        assert (a.task, a.length, a.index) == (b.task, b.length, b.index)
        assert _context(a) != _context(b) and a.expected != b.expected, a.task
    # samples of one seed differ from each other, and a sample does not depend on what else was asked
    by = {(s.task, s.length, s.index): s for s in samples}
    for task in TASKS:
        assert _context(by[(task, 700, 0)]) != _context(by[(task, 700, 1)])
        assert generate_sample(tok, haystack, task, 1000, 1, seed=0, chunk_tokens=CHUNK) == by[(task, 1000, 1)]


def _check_sizes(tokenizer, sample, chunk_tokens):
    sizes = [token_count(tokenizer, c.text) for c in sample.chunks]
    assert [list(c.ids) for c in sample.chunks] == [tokenizer(c.text, add_special_tokens=False)["input_ids"]
                                                   for c in sample.chunks]
    assert len(sizes) >= 2 and all(n == chunk_tokens for n in sizes[:-1]) and 0 < sizes[-1] <= chunk_tokens, sizes
    total = token_count(tokenizer, sample.prefix) + sum(sizes) + token_count(tokenizer, sample.suffix)
    assert sample.length - chunk_tokens < total <= sample.length, (sample.task, total)


def test_chunks_have_the_requested_size_and_the_prompt_the_requested_length(tok, samples):
    for s in samples:
        _check_sizes(tok, s, CHUNK)


def test_real_tokenizer_at_2048_with_512_token_chunks(haystack):
    from transformers import AutoTokenizer

    from ragpic.core.default_model import default_model_dir

    try:
        smol_tok = AutoTokenizer.from_pretrained(str(default_model_dir()))
    except (FileNotFoundError, OSError) as e:
        pytest.skip(f"the embedded SmolLM2 is not installed: {e}")
    for task in TASKS:
        s = generate_sample(smol_tok, haystack, task, 2048, 0, seed=3)
        _check_sizes(smol_tok, s, 512)
        assert len(s.chunks) == 4
        assert sorted(_oracle(s)) == sorted(s.expected), task


def _asked_keys(question: str) -> list[str]:
    keys = re.search(r"for (.+?) mentioned", question).group(1)
    return [k.strip() for k in re.split(r",| and ", keys) if k.strip()]


def _oracle(sample) -> list[str]:
    """The answer read back from the prompt's text alone, the way a perfect reader would."""
    text = _context(sample)
    if sample.task.startswith("niah"):
        found: dict[str, list[str]] = {}
        for key, value in re.findall(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d+)\.", text):
            found.setdefault(key, []).append(value)
        shape = {"niah_single": (1, 1), "niah_multikey": (4, 1), "niah_multivalue": (1, 4), "niah_multiquery": (4, 1)}
        assert (len(found), len(next(iter(found.values())))) == shape[sample.task]
        return [v for k in _asked_keys(sample.question) for v in found[k]]
    if sample.task == "vt":
        value = re.search(r"assigned the value (\d+)", sample.question).group(1)
        edges = re.findall(r"VAR ([A-Z]{5}) = VAR ([A-Z]{5})\.", text)
        holding = {v for v, n in re.findall(r"VAR ([A-Z]{5}) = (\d+)\.", text) if n == value}
        while True:
            more = {b for b, a in edges if a in holding} - holding
            if not more:
                return sorted(holding)
            holding |= more
    entries = re.findall(r"(\d+)\. ([a-z]+)", text)
    assert [int(n) for n, _ in entries] == list(range(1, len(entries) + 1))  # the list survives its chunk cuts
    counts = Counter(w for _, w in entries).most_common()
    assert counts[9][1] > counts[10][1]  # the top 10 are well defined
    return sorted(w for w, _ in counts[:10])


def test_the_answer_is_recoverable_from_the_text(samples):
    for s in samples:
        assert sorted(_oracle(s)) == sorted(s.expected), s.task  # order is not scored
        assert all(any(n in c.text for c in s.chunks) for n in s.needles)  # every needle whole in one chunk


def test_variable_chain_crosses_chunks(tok, haystack):
    for seed in range(4):
        for length in LENGTHS:
            s = generate_sample(tok, haystack, "vt", length, 0, seed=seed, chunk_tokens=CHUNK)
            where = [next(i for i, c in enumerate(s.chunks) if link in c.text) for link in s.needles]
            assert where == sorted(set(where)), where  # each link in a later chunk than the one before
            assert len(s.needles) == min(5, len(s.chunks)) == len(s.expected)
            assert s.needles[0].endswith(re.search(r"value (\d+)", s.question).group(1) + ".")


def test_too_short_for_a_chain_is_refused(tok, haystack):
    with pytest.raises(ValueError, match="at least 2 chunks"):
        generate_sample(tok, haystack, "vt", 400, 0, chunk_tokens=CHUNK)
    with pytest.raises(ValueError, match="unknown RULER task"):
        generate_sample(tok, haystack, "qa", 700, 0)


# ------------------------------------------------------------------ scoring
def test_string_match_all_and_part_by_hand():
    expected = ["1234567", "7654321", "ABCDE"]
    assert scoring.string_match_all("They are 1234567 and abcde.", expected) == pytest.approx(2 / 3)
    assert scoring.string_match_all("1234567, 7654321, ABCDE", expected) == 1.0
    assert scoring.string_match_all("123456", expected) == 0.0  # a prefix of a value is not the value
    assert scoring.string_match_all("anything", []) == 0.0
    assert scoring.string_match_part("it is 7654321", expected) == 1.0
    assert scoring.string_match_part("it is 765432", expected) == 0.0
    # answer identity: SQuAD normalisation on both sides
    assert scoring.exact_match("The Answer, 42!", "answer 42") == 1.0
    assert scoring.exact_match("42", "answer 42") == 0.0


def test_score_answer_uses_the_sample_metric(samples):
    from ragpic.eval.ruler import score_answer

    s = next(x for x in samples if x.task == "niah_multivalue")
    assert score_answer(s, ", ".join(s.expected[:3])) == pytest.approx(3 / 4)
    assert score_answer(s, "none of them") == 0.0


# ------------------------------------------------------------------ end to end (tiny model)
def test_cli_ruler_on_a_saved_tiny_model(tmp_path, capsys):
    from tiny import saved_tiny_model

    from ragpic.cli import main
    from ragpic.cli.ruler import TASK_NAMES

    assert TASK_NAMES == tuple(TASKS)
    model_dir = saved_tiny_model(tmp_path / "tiny-model")
    out = tmp_path / "ruler.json"
    methods = ["full", "naive", "legolink-100000"]
    rc = main(["eval", "ruler", "--model", str(model_dir), "--device", "cpu", "--lengths", "700", "--samples", "1",
               "--chunk-tokens", str(CHUNK), "--methods", "naive,legolink-100000", "--max-new-tokens", "3",
               "--json", str(out)])
    assert rc == 0
    io = capsys.readouterr()
    progress = [line for line in io.err.splitlines() if "[1/1]" in line]
    assert len(progress) == len(TASKS) * len(methods)
    assert all(f"{t} 700 [1/1] {m}:" in io.err for t in TASKS for m in methods)
    assert all(t in io.out for t in TASKS) and "speed-up" in io.out
    res = json.loads(out.read_text())
    assert res["config"]["tasks"] == list(TASKS) and res["config"]["methods"] == methods
    fields = {"samples", "score", "score_ci95", "score_ratio_vs_full", "score_ratio_vs_full_ci95", "same_as_full",
              "same_as_full_ci95", "tf_kl_vs_full", "tf_kl_vs_full_ci95", "ttft_median_s", "ttft_ratio_vs_full",
              "recomputed_tokens", "context_tokens"}
    for task in TASKS:
        assert set(res["summary"][task]) == {"700"}
        assert set(res["summary"][task]["700"]) == set(methods)
        for m in methods:
            assert fields <= set(res["summary"][task]["700"][m]), (task, m)
    assert len(res["samples"]) == len(TASKS)
    for rec in res["samples"]:
        full, lego = rec["methods"]["full"], rec["methods"]["legolink-100000"]
        assert full["tf_kl_vs_full"] == pytest.approx(0.0, abs=1e-4) and full["same_as_full"] == 1.0
        # every chunk token recomputed: the same prefill as full, so the same answer
        assert lego["answer"] == full["answer"] and lego["tf_kl_vs_full"] == pytest.approx(0.0, abs=1e-4)
        # all but the template's head, linked from full's rows (the engine's prefix cache)
        naive = rec["methods"]["naive"]["recomputed_tokens"]
        assert 0 < full["recomputed_tokens"] - lego["recomputed_tokens"] < full["recomputed_tokens"] - naive
        for m, r in rec["methods"].items():  # the recorded score is RULER's on the recorded answer
            assert r["score"] == scoring.string_match_all(r["answer"], rec["expected"])
    overall = res["overall"]
    assert overall["full"]["ttft_ratio_vs_full"] == 1.0 and overall["legolink-100000"]["same_as_full"] == 1.0
    assert overall["naive"]["tf_kl_vs_full"] > 1e-3  # random weights: stale chunk KV does differ
    naive_same = [r["methods"]["naive"]["same_as_full"] for r in res["samples"]]
    assert overall["naive"]["same_as_full"] == pytest.approx(sum(naive_same) / len(naive_same))
    assert overall["naive"]["same_as_full_ci95"] == list(scoring.wilson_ci(naive_same))
    ratio, full_score = overall["naive"]["score_ratio_vs_full"], overall["full"]["score"]
    if full_score == 0:  # random weights rarely name a value: the ratio is then undefined, null in JSON
        assert ratio is None and overall["naive"]["score_ratio_vs_full_ci95"] == [None, None]
    else:
        assert ratio == pytest.approx(overall["naive"]["score"] / full_score)


@pytest.mark.parametrize("argv, words", [
    (["--tasks", "vt,qa"], ["--tasks", "qa", "cwe"]),
    (["--lengths", "600"], ["--lengths", "--chunk-tokens"]),
    (["--samples", "0"], ["--samples", ">= 1"]),
])
def test_usage_errors_name_the_argument(argv, words, capsys):
    from ragpic.cli import main

    assert main(["eval", "ruler", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ragpic eval ruler: error:") and all(w in err for w in words), err
