"""Datasets and prompts for the evaluations: MuSiQue-style QA, the Paul Graham haystack.

A prompt is built as ragpic builds any prompt: separately tokenized segments, in order
(ARCHITECTURE.md §4.5). For QA: the chat-template prefix with the system instruction, then
each passage as one cached chunk with "\\n\\n" text between them, then the question and the
template's assistant header as text. ``full`` prefills exactly the same ids.

The defaults of ``ragpic eval`` / ``eval needle`` / ``bench`` are the small sets shipped in
``ragpic/data`` (:func:`default_dataset`, :func:`default_haystack`; attribution and license
in ``ragpic/data/README.md``), so the commands run from a clone with no path argument.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SYSTEM_PROMPT = "You are a helpful assistant. Answer questions using the given passages."
QA_INSTRUCTION = (
    "Answer the question based on the passages below. Reply with the short answer only "
    "(a few words), no explanation.\n\n"
)
GLUE = "\n\n"
_MARK = "\u0000RAGPIC_USER_CONTENT\u0000"
_DATA = Path(__file__).resolve().parents[1] / "data"  # ragpic/data, shipped as package data


def default_dataset() -> Path:
    """The bundled QA set: the first 32 MuSiQue questions (CC BY 4.0), ``ragpic eval``'s default."""
    return _DATA / "musique_sample.json"


def default_haystack() -> Path:
    """The bundled haystack: four Paul Graham essays (~12.8k tokens), enough for 8k-token prompts."""
    return _DATA / "haystack"


@dataclass(slots=True, frozen=True)
class QAExample:
    question: str
    answers: tuple[str, ...]
    passages: tuple[str, ...]


def load_qa(path: str | Path, limit: int | None = None) -> list[QAExample]:
    """Read a JSON list of ``{"question", "answers", "ctxs": [{"title", "text"}]}``."""
    raw = json.loads(Path(path).read_text())
    if not isinstance(raw, list):
        raise ValueError(f"{path}: expected a JSON list of questions")
    out = []
    for i, item in enumerate(raw[:limit] if limit else raw):
        try:
            answers = item["answers"]
            answers = (answers,) if isinstance(answers, str) else tuple(answers)
            passages = tuple(
                (f"{c['title']}\n{c['text']}" if c.get("title") else c["text"]).strip() for c in item["ctxs"]
            )
            out.append(QAExample(item["question"], answers, tuple(p for p in passages if p)))
        except (KeyError, TypeError) as e:
            raise ValueError(f"{path}: item {i} lacks question/answers/ctxs[].text ({e})") from e
    return out


def template_parts(tokenizer, system: str = SYSTEM_PROMPT) -> tuple[str, str]:
    """``(before, after)`` the user message's content in the model's chat template.

    Falls back to a plain ``system\\n\\n ... \\n\\nAnswer:`` frame for tokenizers without one.
    """
    if getattr(tokenizer, "chat_template", None):
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": _MARK}]
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        if _MARK in text:
            before, after = text.split(_MARK, 1)
            return before, after
    return f"{system}\n\n", "\nAnswer:"


def parse_chunking(spec: str) -> int | None:
    """``passage`` -> None (one chunk per passage); ``tokens:N`` -> N (pieces of <= N tokens)."""
    spec = spec.strip().lower()
    if spec == "passage":
        return None
    kind, _, n = spec.partition(":")
    if kind == "tokens" and n.isdigit() and int(n) > 0:
        return int(n)
    raise ValueError(f"unknown chunking {spec!r}: use 'passage' or 'tokens:<N>' (e.g. tokens:512)")


def qa_chunk_ids(tokenizer, example: QAExample, *, chunk_tokens: int | None = None,
                 passage_tokens: int | None = None) -> list[list[int]]:
    """Token ids of each chunk of an example's passages, in order.

    ``passage_tokens`` first cuts each passage to its first N tokens (to bound prompt length,
    as docs/RESULTS.md §1 does with 192); ``chunk_tokens`` then splits a passage into pieces
    of at most N tokens (passage boundaries are kept; each piece is one cached chunk).
    """
    out = []
    for text in example.passages:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if passage_tokens:
            ids = ids[:passage_tokens]
        step = chunk_tokens or len(ids) or 1
        out.extend(ids[i:i + step] for i in range(0, len(ids), step))
    return [c for c in out if c]


def load_haystack(folder: str | Path) -> str:
    """The essays of ``folder`` (``*.txt``, sorted by name) joined by blank lines."""
    files = sorted(Path(folder).glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"no .txt files in haystack folder {folder}")
    return "\n\n".join(f.read_text(encoding="utf-8", errors="replace").strip() for f in files)
