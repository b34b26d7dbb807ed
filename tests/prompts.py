"""The one prompt the tiny-model tests link: a template head, three chunks, glue, a question.

Chunk 0 and 1 are separated by glue text, chunk 1 and 2 sit back to back (no glue), and the
chunks have unequal lengths: every way a chunk can meet its neighbours is in one prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

from ragpic.core.compile import compile_chunks, compile_in_context
from ragpic.core.kv import ChunkKV
from ragpic.core.segments import Segment, chunk_segment, text_segment

CHUNKS = [
    "the quick brown fox jumps over the lazy dog.",
    "a needle hides in the haystack near dolores park. question: what is",
    "answer: eat a sandwich",  # unequal lengths on purpose
]
HEAD = "<s>system\nanswer from the passages</s>\n<s>user\n"
QUESTION = "\nquestion: what is the best thing to do?</s>\n<s>assistant\n"


def compile_texts(lm, texts: Sequence[str] = CHUNKS, recipe: str = "plain") -> list[ChunkKV]:
    """Compile each text alone (its ids from the model's tokenizer, no special tokens)."""
    ids = [lm.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    return compile_chunks(lm, ids, recipe=recipe)


def linked_prompt(lm, kvs: Sequence[ChunkKV], *, head: str | None = HEAD) -> list[Segment]:
    """``head, chunk0, "\\n\\n", chunk1, chunk2, QUESTION`` (no head: chunk 0 starts at position 0)."""
    tok = lm.tokenizer
    segs = [text_segment(tok, head)] if head else []
    segs += [chunk_segment(kvs[0]), text_segment(tok, "\n\n"), chunk_segment(kvs[1]), chunk_segment(kvs[2]),
             text_segment(tok, QUESTION)]
    return segs


def prompt_with(lm, texts: Sequence[str] = CHUNKS, recipe: str = "plain", **kw) -> list[Segment]:
    """:func:`linked_prompt` over freshly compiled ``texts``."""
    return linked_prompt(lm, compile_texts(lm, texts, recipe), **kw)


def compile_in_place(lm, texts: Sequence[str] = CHUNKS) -> list[ChunkKV]:
    """Each text compiled behind exactly the tokens before it in :func:`linked_prompt` (the head,
    the chunks before it and the glue), as a document compiled in order would be."""
    tok = lm.tokenizer

    def ids(t: str) -> list[int]:
        return tok(t, add_special_tokens=False)["input_ids"]

    chunks = [ids(t) for t in texts]
    before = [ids(HEAD), ids(HEAD) + chunks[0] + ids("\n\n")]
    before.append(before[1] + chunks[1])
    return compile_in_context(lm, chunks, before)
