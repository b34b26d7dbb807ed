"""docs/RESULTS.md is one page of current claims, each checked against the JSON it names.

No model and no torch: the page and the files under docs/results/ are read as text.
"""

from __future__ import annotations

import re

import pytest

from results_page import PAGE, ROOT, claims, missing_figures

CLAIMS = claims()
RESULTS = ROOT / "docs" / "results"


def test_the_page_is_short_and_has_claims():
    assert len(PAGE.read_text().splitlines()) <= 600
    assert len(CLAIMS) >= 10, [c.title for c in CLAIMS]


@pytest.mark.parametrize("claim", CLAIMS, ids=[re.sub(r"[^a-z0-9]+", "-", c.title.lower()).strip("-") for c in CLAIMS])
def test_each_claim_has_its_command_machine_and_json(claim):
    assert "**Command**" in claim.text, f"{claim.title}: no **Command**"
    assert "**Machine**" in claim.text, f"{claim.title}: no **Machine**"
    assert "**JSON**" in claim.text and claim.json_files, f"{claim.title}: names no JSON under results/"
    for name in claim.json_files:
        assert (ROOT / "docs" / name).is_file(), f"{claim.title}: {name} does not exist"
    assert claim.tables, f"{claim.title}: no table"


@pytest.mark.parametrize("claim", CLAIMS, ids=[re.sub(r"[^a-z0-9]+", "-", c.title.lower()).strip("-") for c in CLAIMS])
def test_every_figure_in_a_claims_table_is_in_its_json(claim):
    assert not missing_figures(claim), (f"{claim.title}: figures not found in {', '.join(claim.json_files)} "
                                        f"(rounded as printed): {missing_figures(claim)}")


def test_the_check_catches_a_changed_figure():
    claim = CLAIMS[0]
    row = next(r for t in claim.tables for r in t if re.search(r"\d\.\d+ s", " ".join(r[1:])))
    cell = next(c for c in row[1:] if re.search(r"\d\.\d+ s", c))
    figure = re.search(r"(\d+)\.(\d+) s", cell)
    wrong = f"{figure.group(1)}.{(int(figure.group(2)) + 7) % 10 ** len(figure.group(2)):0{len(figure.group(2))}d} s"
    bad = claim.text.replace(cell, cell.replace(figure.group(0), wrong), 1)
    (changed,) = claims(f"## {claim.title}\n{bad}")
    assert missing_figures(changed), f"{figure.group(0)} -> {wrong} was not caught"


def referenced(name: str, corpus: str) -> bool:
    if name in corpus:
        return True
    stem, dot, ext = name.partition(".")
    # brace patterns as commands write them: bench_hold_dense_15b{,_off}.json, answer_0.5b_avx2_int{4,8}.json
    for m in re.finditer(r"([\w.\-]*)\{([^}]*)\}([\w.\-]*)", corpus):
        if any(m.group(1) + alt + m.group(3) == name or (m.group(1) + alt + m.group(3)).endswith("/" + name)
               for alt in m.group(2).split(",")):
            return True
    return False


def test_no_result_file_is_referenced_nowhere():
    texts = []
    for folder in ("docs", "benchmarks", "tests", "notebooks", "ragpic", "scripts"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in (".md", ".py", ".sh", ".ipynb", ".yml", ".txt") \
                    and RESULTS not in path.parents:
                texts.append(path.read_text(errors="replace"))
    texts.append((ROOT / "README.md").read_text())
    corpus = "\n".join(texts)
    nowhere = sorted(p.name for p in RESULTS.iterdir() if not referenced(p.name, corpus))
    assert not nowhere, f"docs/results/ files referenced nowhere (delete them or cite them): {nowhere}"
