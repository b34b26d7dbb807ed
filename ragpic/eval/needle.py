"""``ragpic eval needle``: needle in a haystack, EPIC's setup (docs/ARCHITECTURE.md §7).

The haystack is the Paul Graham essays; the needle sentence is inserted at a sentence end
at each depth; the context is cut into chunks of ``chunk_tokens`` tokens, each extended to
the next "." (so chunks end on sentences), and every chunk is a cached chunk. Each method
answers greedily (32 tokens); the score is F1 against the needle, as the paper reports, and
a cell is a *hit* when the answer names both "sandwich" and "dolores park"; ``same_as_full``
is answer identity with ``full`` (SQuAD-normalised exact match of the two answers).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

from ragpic.core.model import LoadedModel

from ragpic.eval import scoring
from ragpic.eval.data import load_haystack, template_parts
from ragpic.eval.evaluate import against_full, run_methods
from ragpic.eval.plots import plot_heatmaps
from ragpic.eval.variants import compile_for, head_ids, normalize_methods, opening_of, prompt_segments

__all__ = ["format_table", "plot_heatmaps", "run_needle"]

NEEDLE = "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day."
QUESTION = "What is the best thing to do in San Francisco?"
KEYWORDS = ("sandwich", "dolores park")
DEFAULT_METHODS = ("full", "naive", "legolink-0", "legolink-1", "legolink-16", "cacheblend-15")
SYSTEM = "You are a helpful assistant."
INTRO = "Read the document below, then answer the question after it.\n\nDocument:\n"


def _offsets(tokenizer, text: str) -> list[tuple[int, int]]:
    return tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]


def cut_to_tokens(tokenizer, text: str, n_tokens: int) -> str:
    """The longest prefix of ``text`` within ``n_tokens`` tokens that ends at a "."."""
    offs = _offsets(tokenizer, text[: n_tokens * 12])
    if len(offs) <= n_tokens:
        return text[: offs[-1][1]] if offs else ""
    end = offs[n_tokens - 1][1]
    dot = text.rfind(".", 0, end)
    return text[: dot + 1] if dot > 0 else text[:end]


def insert_needle(text: str, depth: float, needle: str = NEEDLE) -> str:
    """Put ``needle`` at the first sentence end at or after ``depth`` of the text (0: start)."""
    if depth <= 0:
        return f"{needle} {text}"
    dot = text.find(".", int(depth * len(text)) - 1) if depth < 1 else -1
    if dot < 0:
        return f"{text} {needle}"
    return f"{text[:dot + 1]} {needle}{text[dot + 1:]}"


def chunk_text(tokenizer, text: str, chunk_tokens: int = 512) -> list[str]:
    """Cut ``text`` into pieces of ``chunk_tokens`` tokens, each extended to the next "."."""
    offs = _offsets(tokenizer, text)
    chunks, start, tok = [], 0, 0
    while tok < len(offs):
        k = tok + chunk_tokens - 1
        if k >= len(offs) - 1:
            chunks.append(text[start:])
            break
        end = offs[k][1]
        dot = text.find(".", end - 1)
        end = len(text) if dot < 0 else dot + 1
        chunks.append(text[start:end])
        start = end
        while tok < len(offs) and offs[tok][1] <= end:
            tok += 1
    return [c for c in chunks if c.strip()]


def needle_chunks(tokenizer, haystack: str, length: int, depth: float, *, chunk_tokens: int = 512,
                  budget_slack: int = 0) -> tuple[str, list[str], str]:
    """(prefix text, chunk texts, suffix text) of a prompt of about ``length`` tokens."""
    before, after = template_parts(tokenizer, SYSTEM)
    prefix = before + INTRO
    suffix = f"\n\nQuestion: {QUESTION} Answer in one sentence, using the document.{after}"
    n = lambda s: len(tokenizer(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    budget = length - n(prefix) - n(suffix) - n(NEEDLE) - 2 - budget_slack
    if budget < 16:
        raise ValueError(f"length {length} is too short for the needle prompt")
    text = insert_needle(cut_to_tokens(tokenizer, haystack, budget), depth)
    return prefix, chunk_text(tokenizer, text, chunk_tokens), suffix


def run_needle(lm: LoadedModel, haystack_dir: str | Path, *, lengths: Sequence[int] = (1024, 2048, 4096),
               depths: Sequence[float] = (0, 0.25, 0.5, 0.75, 1.0), methods: Sequence[str] | str | None = None,
               chunk_tokens: int = 512, max_new_tokens: int = 32,
               progress: Callable[[str], None] | None = None, prefix_cache: bool = True) -> dict:
    """Every (length, depth) cell, every method. Returns ``{"config", "cells", "summary"}``
    (``prefix_cache``: as :func:`~ragpic.eval.evaluate.run_methods`)."""
    methods = normalize_methods(methods, DEFAULT_METHODS)
    haystack = load_haystack(haystack_dir)
    tok = lm.tokenizer
    cells = []
    for length in lengths:
        memo: dict = {}  # chunks before the needle repeat across depths
        for depth in depths:
            slack = 0
            while True:
                prefix, texts, suffix = needle_chunks(tok, haystack, length, depth, chunk_tokens=chunk_tokens,
                                                      budget_slack=slack)
                ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
                segs_probe = prompt_segments(tok, prefix, [], suffix)
                total = sum(len(i) for i in ids) + sum(s.num_tokens for s in segs_probe)
                over = total + max_new_tokens + 1 - lm.context_window
                if over <= 0:
                    break
                slack += over + 8
            kvs = compile_for(lm, ids, methods, memo, head=head_ids(tok, prefix),
                              opening=opening_of(tok, prefix, template_parts(tok, SYSTEM)[0]))
            segs = {r: prompt_segments(tok, prefix, kv, suffix, glue=None) for r, kv in kvs.items()}
            runs = run_methods(lm, segs, methods, max_new_tokens, prefix_cache=prefix_cache)
            for m, r in runs.items():
                cells.append({
                    "length": length, "depth": depth, "context_tokens": r.num_tokens, "chunks": len(ids),
                    "method": m, **against_full(r, runs["full"]), "f1": scoring.f1_score(r.answer, NEEDLE),
                    "hit": scoring.needle_hit(r.answer, KEYWORDS),
                })
            if progress:
                progress(f"length {length} depth {depth}: {runs['full'].num_tokens} tokens, "
                         + " ".join(f"{m}={'H' if scoring.needle_hit(r.answer, KEYWORDS) else '.'}"
                                    for m, r in runs.items()))
    return {"config": {"lengths": list(lengths), "depths": list(depths), "methods": methods,
                       "chunk_tokens": chunk_tokens, "max_new_tokens": max_new_tokens, "needle": NEEDLE,
                       "prefix_cache": prefix_cache,
                       "question": QUESTION, "model": lm.name, "fingerprint": lm.fingerprint},
            "cells": cells, "summary": summarize(cells, methods)}


def summarize(cells: Sequence[dict], methods: Sequence[str]) -> dict[str, dict]:
    """Per method: hits overall, hits in the cells where ``full`` hits, mean F1 / KL / answer
    identity with ``full`` (with its Wilson 95% interval), and the
    median over cells of ``full``'s link time / the method's (``ttft_ratio_vs_full``)."""
    full_hit = {(c["length"], c["depth"]) for c in cells if c["method"] == "full" and c["hit"]}
    full_s = {(c["length"], c["depth"]): c["ttft_s"] for c in cells if c["method"] == "full"}
    out = {}
    for m in methods:
        mine = [c for c in cells if c["method"] == m]
        where = [c for c in mine if (c["length"], c["depth"]) in full_hit]
        same = [c["same_as_full"] for c in mine]
        out[m] = {
            "cells": len(mine), "hits": sum(c["hit"] for c in mine), "f1": scoring.mean([c["f1"] for c in mine]),
            "full_hit_cells": len(where), "hits_where_full_hits": sum(c["hit"] for c in where),
            "f1_where_full_hits": scoring.mean([c["f1"] for c in where]),
            "tf_kl_vs_full": scoring.mean([c["tf_kl_vs_full"] for c in mine]),
            "same_as_full": scoring.mean(same), "same_as_full_ci95": list(scoring.wilson_ci(same)),
            "ttft_ratio_vs_full": statistics.median(full_s[(c["length"], c["depth"])] / c["ttft_s"] for c in mine)
            if mine and all((c["length"], c["depth"]) in full_s for c in mine) else None,
        }
    return out


def format_table(result: dict) -> str:
    lengths, depths = result["config"]["lengths"], result["config"]["depths"]
    lines = []
    by = {(c["method"], c["length"], c["depth"]): c for c in result["cells"]}
    head = (f"{'method':<15}" + "".join(f"{L:>8}" for L in lengths)
            + f"{'hits':>7}{'|full':>7}{'F1':>7}{'tf_kl':>8}{'same':>6}{'speed-up':>10}")
    lines += ["hits per length (of %d depths)" % len(depths), head, "-" * len(head)]
    for m, s in result["summary"].items():
        row = "".join(f"{sum(by[(m, L, d)]['hit'] for d in depths if (m, L, d) in by):>8}" for L in lengths)
        lines.append(f"{m:<15}{row}{s['hits']:>7}{s['hits_where_full_hits']:>4}/{s['full_hit_cells']:<2}"
                     f"{s['f1']:>7.3f}{s['tf_kl_vs_full']:>8.3f}{s['same_as_full']:>6.2f}"
                     + (f"{s['ttft_ratio_vs_full']:>9.1f}x" if s.get("ttft_ratio_vs_full") else f"{'-':>10}"))
    return "\n".join(lines)
