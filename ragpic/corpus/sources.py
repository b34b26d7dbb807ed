"""A corpus's documents, read from what a user has: folders, JSONL files, framework documents.

A :class:`Doc` is one document before chunking: a ``name`` that says where it came from (a
file's path relative to its folder, ``file.jsonl:7`` for a line), its text, and the metadata a
framework would attach to it (``{"file": name}`` for a folder's files, exactly as ``ragpic demo``
does, so the chunk texts and hence the store keys are the same; ARCHITECTURE §4.4). Reading is
lazy (one document at a time) and stdlib only; bad input raises :class:`UsageError` naming the
file and line before anything is compiled for it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragpic.errors import UsageError

__all__ = ["Doc", "SUFFIXES", "doc_from", "doc_of", "file_doc", "folder_files", "read_jsonl", "read_source",
           "read_sources", "read_text_bytes"]

SUFFIXES = (".txt", ".md")


@dataclass(frozen=True, slots=True)
class Doc:
    """One document: where it came from, its text, and its metadata (``str -> JSON value``)."""

    name: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    original: Any = field(default=None, hash=False, compare=False, repr=False)  # a framework's own document


def folder_files(root: Path, option: str = "SOURCE") -> list[Path]:
    """The ``.txt`` / ``.md`` files under ``root``, sorted, hidden folders (``.git``) skipped."""
    paths = sorted(p for p in root.rglob("*") if p.suffix.lower() in SUFFIXES and not p.is_dir()
                   and not any(part.startswith(".") for part in p.relative_to(root).parts))
    if not paths:
        raise UsageError(f"{option} {root}: no .txt or .md files in it; pass a folder of text documents")
    return paths


def read_text_bytes(path: Path, name: str, option: str = "SOURCE") -> bytes:
    """The bytes of a text file, checked to be UTF-8 (``name`` says which file in errors)."""
    try:
        data = path.read_bytes()
        data.decode("utf-8")
        return data
    except OSError as e:
        raise UsageError(f"{option} {path}: cannot read {name} ({e.strerror or e}); fix its permissions "
                         "or remove it") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{option} {path}: {name} is not UTF-8 text (byte {e.start}); convert it to UTF-8 "
                         "or remove it") from None


def file_doc(path: Path, name: str, option: str = "SOURCE") -> Doc:
    """A text file as one document: named ``name`` (its path relative to its folder) and tagged
    ``{"file": name}``, the metadata line ``ragpic demo`` gives it, so both cut the same chunks."""
    return Doc(name, read_text_bytes(path, name, option).decode("utf-8"), {"file": name})


def parse_jsonl_line(line: str, where: str) -> Doc | None:
    """One JSONL line -> a :class:`Doc` (``None`` for a blank line), see :func:`doc_of`."""
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except ValueError as e:
        raise UsageError(f"{where}: not JSON ({e.msg}); each line must be an object like "
                         '{"text": "...", "id": "...", "metadata": {...}}') from None
    return doc_of(obj, where)


def doc_of(obj: object, where: str) -> Doc:
    """A parsed JSONL object (or a dict given to the Python API) -> a :class:`Doc`: a ``text``
    string, an optional ``id`` (the document's name; default ``where``) and an optional
    ``metadata`` object."""
    if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
        raise UsageError(f"{where}: each line must be a JSON object with a \"text\" string, got "
                         f"{type(obj).__name__}{' without text' if isinstance(obj, dict) else ''}")
    meta = obj.get("metadata", {})
    if not isinstance(meta, dict):
        raise UsageError(f"{where}: \"metadata\" must be an object, got {type(meta).__name__}")
    name = obj.get("id", where)
    return Doc(str(name), obj["text"], meta)


def read_jsonl(path: Path, option: str = "SOURCE") -> Iterator[Doc]:
    """The documents of a JSONL file, one a line (:func:`parse_jsonl_line`)."""
    try:
        handle = path.open(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"{option} {path}: cannot read it ({e.strerror or e})") from None
    with handle:
        try:
            for n, line in enumerate(handle, 1):
                doc = parse_jsonl_line(line, f"{path.name}:{n}")
                if doc is not None:
                    yield doc
        except UnicodeDecodeError as e:
            raise UsageError(f"{option} {path}: not UTF-8 text (byte {e.start}); convert it to UTF-8") from None


def read_source(source: str | os.PathLike, option: str = "SOURCE") -> Iterator[Doc]:
    """The documents of one source: a folder of ``.txt``/``.md`` files, a ``.jsonl`` file, or one
    ``.txt``/``.md`` file."""
    path = Path(source).expanduser()
    if not path.exists():
        raise UsageError(f"{option} {source}: no such file or folder; pass a folder of .txt/.md files or "
                         "a .jsonl file")
    if path.is_dir():
        for p in folder_files(path, option):
            yield file_doc(p, p.relative_to(path).as_posix(), option)
    elif path.suffix.lower() == ".jsonl":
        yield from read_jsonl(path, option)
    elif path.suffix.lower() in SUFFIXES:
        yield file_doc(path, path.name, option)
    else:
        raise UsageError(f"{option} {source}: not a folder, a .jsonl, a .txt or a .md file")


def read_sources(sources: Iterable[str | os.PathLike], option: str = "SOURCE") -> Iterator[Doc]:
    """Every document of ``sources`` (folders of ``.txt``/``.md`` files, ``.jsonl`` files, as
    ``ragpic compile`` takes them), in order; ``option`` names the argument in errors."""
    for source in sources:
        yield from read_source(source, option)


def doc_from(obj: Any, i: int) -> Doc:
    """A document from what a loader returns: a LlamaIndex ``Document``/node (``text``,
    ``metadata``, ``id_``), a LangChain ``Document`` (``page_content``, ``metadata``, ``id``), a
    dict like a JSONL line, or a ``str``; ``i`` names it in errors (``documents[i]``)."""
    if isinstance(obj, Doc):
        return obj
    if isinstance(obj, str):
        return Doc(f"documents[{i}]", obj)
    if isinstance(obj, dict):
        return doc_of(obj, f"documents[{i}]")
    text = getattr(obj, "page_content", None)
    if text is None:
        text = getattr(obj, "text", None)
    if not isinstance(text, str):
        raise UsageError(f"documents[{i}]: expected a LlamaIndex or LangChain Document, a dict with \"text\" or "
                         f"a str, got {type(obj).__name__}")
    name = getattr(obj, "id_", None) or getattr(obj, "id", None) or f"documents[{i}]"
    # The framework's object is kept: its own settings (LlamaIndex's excluded metadata keys,
    # templates) decide the text a prompt holds, so chunking reads it, not a copy.
    return Doc(str(name), text, dict(getattr(obj, "metadata", None) or {}), obj)
