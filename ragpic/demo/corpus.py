"""The demo's documents and the manifest that says which of them an index holds (stdlib only).

A corpus is a list of :class:`SourceFile` (a name, its text, size and sha256): the ``.txt``
/ ``.md`` files of a folder, or the bundled showcase (``ragpic/data/showcase``: ten short
documents, and a question with its gold answer, :func:`showcase_questions`). The manifest,
written last into the index folder, records the folder's resolved path, the model and chunk
size, and per file its size, hash and node ids; comparing it with the corpus says what
changed (:func:`diff_files`), so only those files' chunks are compiled or dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from ragpic.corpus.sources import SUFFIXES, folder_files, read_text_bytes
from ragpic.errors import UsageError
MANIFEST = "ragpic_manifest.json"
MANIFEST_VERSION = 1
BUNDLED = "bundled:ragpic/data/showcase"  # the source key of the default corpus


@dataclass(frozen=True, slots=True)
class SourceFile:
    """One document: ``name`` (path relative to the folder), text, and what identifies it."""

    name: str
    text: str
    size: int
    sha256: str
    metadata: dict = field(default_factory=dict, hash=False, compare=False)


def sample_questions() -> list[dict]:
    """The bundled MuSiQue sample (32 questions, 10 passages each, CC BY 4.0; ragpic/data/README.md).

    What ``ragpic eval`` and the notebooks use; the demo's default corpus is the showcase."""
    return json.loads(resources.files("ragpic").joinpath("data", "musique_sample.json").read_text())


def _showcase():
    return resources.files("ragpic").joinpath("data", "showcase")


def showcase_questions() -> list[dict]:
    """The showcase's questions: ``{"question", "answer" (gold, found in the passage), "file"
    (the passage that holds it)}``; the demo asks the first one when no folder is given."""
    return json.loads(_showcase().joinpath("questions.json").read_text())


def _source_file(name: str, data: bytes, metadata: dict) -> SourceFile:
    return SourceFile(name, data.decode("utf-8"), len(data), hashlib.sha256(data).hexdigest(), metadata)


def bundled_corpus() -> list[SourceFile]:
    """The showcase's ``.md`` passages, named and tagged as :func:`read_folder` would."""
    docs = sorted((p for p in _showcase().iterdir() if p.name.endswith(SUFFIXES)), key=lambda p: p.name)
    return [_source_file(p.name, p.read_bytes(), {"file": p.name}) for p in docs]


def read_folder(folder: str | os.PathLike) -> list[SourceFile]:
    """Every ``.txt`` / ``.md`` file under ``folder``, read and hashed.

    Raises :class:`UsageError` (before anything is loaded or written) when the folder does not
    exist, holds no such file, or a file cannot be read as UTF-8 text.
    """
    root = Path(folder).expanduser()
    if not root.exists():
        raise UsageError(f"--folder {folder}: no such folder; pass a folder of .txt or .md files")
    if not root.is_dir():
        raise UsageError(f"--folder {folder}: not a folder; pass a folder of .txt or .md files")
    files = []
    for p in folder_files(root, "--folder"):  # the files `ragpic compile` reads, named the same way
        name = p.relative_to(root).as_posix()
        files.append(_source_file(name, read_text_bytes(p, name, "--folder"), {"file": name}))
    return files


def source_key(folder: str | os.PathLike | None) -> str:
    """What an index is an index *of*: the folder's resolved path, or the bundled corpus."""
    return BUNDLED if folder is None else str(Path(folder).expanduser().resolve())


# ----- manifest -------------------------------------------------------------------------


def load_manifest(index_folder: Path) -> dict | None:
    """The manifest of ``index_folder``, or ``None`` (no index yet, or an unreadable one)."""
    try:
        m = json.loads((index_folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and m.get("version") == MANIFEST_VERSION else None


def save_manifest(index_folder: Path, manifest: dict) -> None:
    """Write the manifest atomically (last, after the index files: a crash leaves the old one)."""
    tmp = index_folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps({"version": MANIFEST_VERSION, **manifest}, indent=1))
    os.replace(tmp, index_folder / MANIFEST)


@dataclass(slots=True)
class Changes:
    """Which files of the corpus the index already holds, by name."""

    unchanged: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    @property
    def to_ingest(self) -> list[str]:
        return self.added + self.changed

    @property
    def to_drop(self) -> list[str]:
        return self.changed + self.removed


def diff_files(recorded: dict[str, dict], corpus: list[SourceFile]) -> Changes:
    """Compare the manifest's ``files`` entry with the corpus (size and sha256 per name)."""
    ch = Changes()
    names = set()
    for f in corpus:
        names.add(f.name)
        old = recorded.get(f.name)
        if old is None:
            ch.added.append(f.name)
        elif (old.get("size"), old.get("sha256")) == (f.size, f.sha256):
            ch.unchanged.append(f.name)
        else:
            ch.changed.append(f.name)
    ch.removed = sorted(set(recorded) - names)
    return ch


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def describe(ch: Changes, new_chunks: int, compiled: int, dropped: int) -> str:
    """One line saying what the ingest did, e.g. ``3 files unchanged, 1 added: 2 chunks compiled``."""
    parts = [f"{len(ch.unchanged)} file{'' if len(ch.unchanged) == 1 else 's'} unchanged"] if ch.unchanged else []
    for word, names in (("added", ch.added), ("changed", ch.changed), ("removed", ch.removed)):
        if names:
            parts.append(f"{len(names)} {word}" if parts else f"{_n(len(names), 'file')} {word}")
    what = []
    if new_chunks:
        what.append(_n(compiled, "chunk") + " compiled" if compiled == new_chunks else
                    f"{_n(new_chunks, 'new chunk')} ({compiled} compiled, {new_chunks - compiled} already in the KV store)")
    elif compiled:  # nodes unchanged, but their KV was not in the store (deleted, evicted, a new store=)
        what.append(f"{_n(compiled, 'chunk')} compiled again (their KV was missing from the KV store)")
    if dropped:
        what.append(f"{_n(dropped, 'chunk')} dropped")
    return f"{', '.join(parts)}: {', '.join(what) or 'nothing to ingest'}"
