"""A tiny model folder and a small corpus for the ``ragpic compile`` tests (no download)."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ("the quick brown fox jumps over the lazy dog a needle hides in the haystack near dolores park "
         "passages are compiled once and linked many times positions move the keys rotate with them").split()


def write_corpus(folder: Path, files: int = 3, sentences: int = 60, seed: int = 0) -> Path:
    """``files`` .txt/.md files of random sentences (each file different), plus a hidden one
    that must be skipped; returns ``folder``."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        text = "\n\n".join(
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20))).capitalize() + f". Fact {i}-{s}."
            for s in range(sentences))
        (folder / ("sub" if i == 2 else "")).mkdir(exist_ok=True)
        (folder / ("sub" if i == 2 else "") / f"doc{i}.{'md' if i == 1 else 'txt'}").write_text(text)
    (folder / ".hidden").mkdir(exist_ok=True)
    (folder / ".hidden" / "skip.txt").write_text("never compiled " * 50)
    return folder


def write_jsonl(path: Path, n: int = 4) -> Path:
    rows = [{"id": f"row{i}", "text": f"Row {i}. " + "the keys rotate with them and the fox jumps. " * 12,
             "metadata": {"title": f"title {i}"}} for i in range(n)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    return path


def folder_keys(store: Path) -> set[str]:
    """The keys of a folder store's entries (their file names)."""
    return {p.stem for p in (store / "entries").rglob("*.rpkv")}
