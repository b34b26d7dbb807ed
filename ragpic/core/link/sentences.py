"""Sentence runs (``-s`` on ``qr`` / ``qp``): repair whole sentences, not 16-token slices.

``qr`` and ``qp`` choose the chunk tokens they repair in runs. Plain runs are :data:`SPAN`
tokens counted from each chunk's start (:func:`~ragpic.core.link.query_guided.chunk_spans`), so
a fact of ~20 tokens (a RULER needle, ``One of the special magic numbers for dusty-tunnel is:
6532764.``) straddles two of them, and a run or hop window that the question picks covers
its key and stops short of its value. On the 1.5B's multi-value prompts every value a linked
answer dropped belonged to a needle its selection covered only 48-76% of
(docs/RESULTS.md §28). With ``-s`` the runs end where sentences do:

- a run closes after a token whose text holds a sentence mark (:data:`SENTENCE_MARKS`: ``.``,
  ``!``, ``?``, a newline, their CJK forms) once it has :data:`MIN_RUN` tokens, so a needle
  placed between sentences is one run, and short lines join the next;
- a run never grows past :data:`MAX_RUN` tokens (a long sentence, a table row, code without
  stops is cut there), so one run cannot take a budget's share alone;
- hop and question-word windows take the run that holds the occurrence
  (:func:`~ragpic.core.link.hops.select_with_hops`).

Runs still cover every token of every chunk past position 0, exactly as plain runs do, so a
budget buys as many rows and ``-s`` at 100% is ``full``. The marks are read from the prompt's
own ids (one decode per distinct id), so nothing depends on the tokenizer family.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ragpic.core.segments import Segment, segment_starts

__all__ = ["MAX_RUN", "MIN_RUN", "SENTENCE_MARKS", "sentence_ends", "sentence_spans"]

SENTENCE_MARKS = frozenset(".!?\n。！？")
"""Characters that end a sentence (or a line) in a token's decoded text."""

MIN_RUN = 8
"""A run closes at a sentence mark only once it holds this many tokens: a bare newline or a
three-word line joins the sentence after it instead of spending a run on its own."""

MAX_RUN = 32
"""Longest run: two plain runs. Long enough for a needle or a ``VAR B = VAR A`` statement with
the sentence before it; a sentence past it is cut."""


def sentence_ends(tokenizer, ids: torch.Tensor) -> torch.Tensor:
    """``(N,)`` bool on the CPU: the prompt tokens whose decoded text holds a sentence mark.

    ``ids``: the prompt's ``(N,)`` host token ids; ``tokenizer``: the model's (Hugging Face) tokenizer.
    """
    host = ids.tolist()
    marks = {t: any(c in SENTENCE_MARKS for c in tokenizer.decode([t])) for t in set(host)}
    return torch.tensor([marks[t] for t in host], dtype=torch.bool)


def sentence_spans(segments: Sequence[Segment], ends: torch.Tensor, min_run: int = MIN_RUN,
                   max_run: int = MAX_RUN) -> list[tuple[int, int]]:
    """``[start, end)`` global positions of every sentence run of every chunk past position 0.

    ``ends``: ``(N,)`` bool, :func:`sentence_ends`. A run closes after a mark once it holds
    ``min_run`` tokens, at ``max_run`` tokens, and at its chunk's end; together the runs cover
    the same tokens as :func:`~ragpic.core.link.query_guided.chunk_spans` (ARCHITECTURE §4.9).
    """
    runs = []
    marks = ends.tolist()
    for seg, start in zip(segments, segment_starts(segments)):
        if not seg.is_chunk or start == 0:
            continue
        a, stop = start, start + seg.num_tokens
        for p in range(start, stop):
            if (marks[p] and p + 1 - a >= min_run) or p + 1 - a == max_run or p + 1 == stop:
                runs.append((a, p + 1))
                a = p + 1
    return runs
