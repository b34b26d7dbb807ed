"""`ragpic demo`, the main job, end to end on SmolLM2 + MiniLM + FAISS (small folders).

The bundled showcase, as a newcomer first runs it, retrieves the passage that holds the gold
answer and both `full` and the default method answer with it. The index is the folder's (by
resolved path, never by base name), re-runs ingest only what changed and say so, and a failed
run leaves no folder behind.
"""

from __future__ import annotations

import io
import json
import re

import pytest

from ragpic.cli import main, parse
from ragpic.demo import run

pytestmark = pytest.mark.integration

ARGS = ["--max-new-tokens", "4", "--top-k", "2"]


@pytest.fixture
def home(tmp_path, monkeypatch):
    """Demo indexes go to a temp folder (the converted model stays in the real cache)."""
    monkeypatch.setattr("ragpic.demo.index.demo_home", lambda: tmp_path / "demo_home")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a terminal: no interactive loop
    return tmp_path / "demo_home"


def _folder(root, musique, q: int, prefix: str):
    """Three one-chunk files (90 words each) from the passages of question ``q``."""
    folder = root / "sf_docs"
    folder.mkdir(parents=True)
    for i, c in enumerate(musique[q]["ctxs"][:3]):
        (folder / f"{prefix}{i}.txt").write_text(" ".join(c["text"].split()[:90]))
    return folder


def _run(argv):
    args = parse(["demo", *argv, *ARGS])
    out = io.StringIO()
    results = run(args, out=out)
    return args, results, out.getvalue()


def _manifest(args) -> dict:
    return json.loads((args.index_folder / "ragpic_manifest.json").read_text())


def test_bundled_showcase_is_answered_correctly_by_full_and_the_default_method(smol, home, monkeypatch):
    """`ragpic demo` with no argument: the gold passage is retrieved, both answers hold the gold answer."""
    import ragpic
    from ragpic.demo import showcase_questions

    real = ragpic.RagPic
    monkeypatch.setattr(ragpic, "RagPic", lambda config, **kw: real(config, lm=smol, **kw))  # the session's model
    item = showcase_questions()[0]
    args = parse(["demo"])  # the defaults a newcomer gets: showcase corpus and question, top 4, auto
    out = io.StringIO()
    results = run(args, out=out)
    text = out.getvalue()
    assert args.index_folder.parent == home and args.index_folder.name.startswith("bundled-showcase-")
    assert f"Q: {item['question']}" in text and "ingest: 10 files added: 10 chunks compiled" in text, text
    retrieved = [line.split()[3] for line in text.splitlines() if " cos " in line]  # "1. cos 0.71  name.md ..."
    assert len(retrieved) == args.top_k == 4 and item["file"] in retrieved, text
    full, linked = results[0]["full"], results[0]["linked"]
    assert linked.method == "fast" and linked.chunks_loaded == 4  # auto, from SmolLM2's shipped calibration
    assert item["answer"].lower() in full.text.lower(), text
    assert item["answer"].lower() in linked.text.lower(), text
    assert len(re.findall(r"ttft +\d+ ms  answer +\d+ ms \(\d+ tokens\)", text)) == 2, text  # TTFT and whole answer


def test_showcase_files_hold_their_gold_answers() -> None:
    from ragpic.demo.corpus import BUNDLED, bundled_corpus, source_key, showcase_questions

    corpus = {f.name: f for f in bundled_corpus()}
    assert len(corpus) == 10 and all(f.metadata == {"file": n} for n, f in corpus.items())
    assert source_key(None) == BUNDLED
    for q in showcase_questions():
        assert q["answer"] in corpus[q["file"]].text, q


def test_same_base_name_two_indexes_and_incremental_reingest(tmp_path, musique, home):
    a = _folder(tmp_path / "a", musique, 0, "a")
    b = _folder(tmp_path / "b", musique, 1, "b")
    qa, qb = musique[0]["question"], musique[1]["question"]

    args_a, first, text = _run(["--folder", str(a), "-q", qa])
    assert "ingest: 3 files added: 3 chunks compiled" in text, text
    assert "TTFT speed-up" in text and "cosine similarity" in text
    assert first[0]["linked"].chunks_loaded == 2 and first[0]["linked"].method == "fast"
    assert first[0]["full"].recomputed_tokens == first[0]["full"].prompt_tokens

    args_b, _, text_b = _run(["--folder", str(b), "-q", qb])  # same base name "sf_docs", other folder
    assert args_b.index_folder != args_a.index_folder and args_b.index_folder.parent == home
    assert "ingest: 3 files added: 3 chunks compiled" in text_b, text_b  # not "reloading" a's index
    names = [line.split()[3] for line in text_b.splitlines() if " cos " in line]  # "1. cos 0.41  b0.txt ..."
    assert len(names) == 2 and all(n.startswith("b") for n in names), names  # b's own documents
    assert _manifest(args_b)["source"] == str(b.resolve())

    _, again, text = _run(["--folder", str(a), "-q", qa])  # nothing changed: nothing compiled
    assert "ingest: 3 files unchanged: nothing to ingest" in text, text
    g = again[0]["linked"]
    assert (g.chunks_loaded, g.chunks_compiled) == (2, 0) and g.text == first[0]["linked"].text

    before = _manifest(args_a)["files"]
    (a / "a1.txt").write_text((a / "a1.txt").read_text() + " It was edited today.")
    args_a2, edited, text = _run(["--folder", str(a), "-q", qa])
    assert "ingest: 2 files unchanged, 1 changed: 1 chunk compiled, 1 chunk dropped" in text, text
    after = _manifest(args_a2)["files"]
    assert after["a0.txt"]["nodes"] == before["a0.txt"]["nodes"]  # untouched files keep their nodes
    assert after["a2.txt"]["nodes"] == before["a2.txt"]["nodes"]
    assert after["a1.txt"]["nodes"] != before["a1.txt"]["nodes"]
    assert edited[0]["linked"].chunks_compiled == 0  # everything retrieved was compiled at ingest

    (a / "a2.txt").unlink()
    (a / "extra.md").write_text("Dolores Park is a park in San Francisco.")
    _, _, text = _run(["--folder", str(a), "-q", qa])
    assert "ingest: 2 files unchanged, 1 added, 1 removed: 1 chunk compiled, 1 chunk dropped" in text, text


def test_a_failed_first_run_leaves_no_index_folder(tmp_path, musique, home, monkeypatch, capsys):
    from ragpic.errors import ChunkError

    def fail(*args, **kwargs):
        raise ChunkError("chunk 3 cannot be compiled (simulated)")

    monkeypatch.setattr("ragpic.demo.index.sync_index", fail)
    folder = _folder(tmp_path, musique, 0, "p")
    assert main(["demo", "--folder", str(folder), *ARGS]) == 1
    err = capsys.readouterr().err
    ours = [line for line in err.splitlines() if line.startswith("ragpic")]  # transformers' load bar aside
    assert len(ours) == 1 and "simulated" in ours[0] and "Traceback" not in err, err
    assert not home.exists() or not any(home.iterdir()), list(home.rglob("*"))


def test_ingest_line_says_when_unchanged_files_had_their_kv_compiled_again() -> None:
    from ragpic.demo.corpus import Changes, describe

    assert describe(Changes(unchanged=["a.txt", "b.txt"]), 0, 60, 0) == \
        "2 files unchanged: 60 chunks compiled again (their KV was missing from the KV store)"
    assert describe(Changes(unchanged=["a.txt"]), 0, 0, 0) == "1 file unchanged: nothing to ingest"
