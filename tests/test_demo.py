"""`ragpic demo`, the main job, end to end on SmolLM2 + MiniLM + FAISS (small folder)."""

from __future__ import annotations

import io

import pytest

from ragpic.cli import build_parser
from ragpic.demo import run

pytestmark = pytest.mark.integration


def test_demo_ingests_a_folder_answers_and_reloads_without_compiling(tmp_path, musique, monkeypatch):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i, c in enumerate(musique[0]["ctxs"][:3]):
        (docs / f"p{i}.txt").write_text(" ".join(c["text"].split()[:90]))
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a terminal: no interactive loop
    argv = ["demo", "--folder", str(docs), "--index", str(tmp_path / "idx"), "--max-new-tokens", "6",
            "--top-k", "2", "--question", musique[0]["question"]]
    out = io.StringIO()
    first = run(build_parser().parse_args(argv), out=out)
    text = out.getvalue()
    assert "ingesting 3 documents" in text and "TTFT speed-up" in text and "retrieved" in text
    assert first[0]["linked"].chunks_loaded == 2 and first[0]["linked"].method == "legolink-16"
    assert first[0]["full"].recomputed_tokens == first[0]["full"].prompt_tokens

    out = io.StringIO()
    again = run(build_parser().parse_args(argv), out=out)
    assert "reloading index" in out.getvalue()
    g = again[0]["linked"]
    assert (g.chunks_loaded, g.chunks_compiled) == (2, 0)
    assert g.text == first[0]["linked"].text
