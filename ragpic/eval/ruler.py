"""``ragpic eval ruler``: RULER-style tasks (:mod:`ragpic.eval.ruler_tasks`) run with every method.

Each sample's chunks are compiled once per recipe; every method links the same ids and
answers greedily; ``full`` goes first and its answer teacher-forces the others (as in
:mod:`ragpic.eval.evaluate`). Per sample and method: the RULER score (string match of the
expected values in the answer: the share found, ``string_match_all``), answer identity
with ``full`` (SQuAD-normalised exact match), TF KL(full || method) over ``full``'s answer,
and the link time. Per task and length, and over everything: mean score with a bootstrap
95% interval, its ratio to ``full``'s with a paired bootstrap interval over samples, mean
TF KL, answer identity, and the median over samples of ``full``'s link time / the method's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from ragpic.core.model import LoadedModel
from ragpic.eval import scoring
from ragpic.eval.data import load_haystack, template_parts
from ragpic.eval.evaluate import MethodRun, against_full, run_methods
from ragpic.eval.ruler_tasks import SYSTEM, TASKS, RulerSample, generate_sample
from ragpic.eval.variants import compile_for, head_ids, normalize_methods, opening_of, prompt_segments

__all__ = ["DEFAULT_METHODS", "format_table", "run_ruler", "score_answer", "summaries", "summarize"]

DEFAULT_METHODS = ("full", "naive", "legolink-16", "cacheblend-15", "qr-10")
DEFAULT_LENGTHS = (2048, 4096, 8192)
_METRICS = {"all": scoring.string_match_all, "part": scoring.string_match_part}


def score_answer(sample: RulerSample, answer: str) -> float:
    """The sample's RULER score of ``answer`` (its metric over its expected strings)."""
    return _METRICS[sample.metric](answer, sample.expected)


def _run_sample(lm: LoadedModel, sample: RulerSample, methods: Sequence[str], max_new_tokens: int,
                progress: Callable[[str], None] | None, where: str, prefix_cache: bool = True) -> dict:
    """Every method on one sample; returns its JSON record (``prefix_cache``: as
    :func:`~ragpic.eval.evaluate.run_methods`)."""
    tok = lm.tokenizer
    kvs = compile_for(lm, [list(c.ids) for c in sample.chunks], methods, head=head_ids(tok, sample.prefix),
                      opening=opening_of(tok, sample.prefix, template_parts(tok, SYSTEM)[0]))
    segs = {r: prompt_segments(lm.tokenizer, sample.prefix, kv, sample.suffix, glue=None) for r, kv in kvs.items()}

    def said(m: str, run: MethodRun) -> None:
        progress(f"{where} {m}: score {score_answer(sample, run.answer):.2f} {run.answer[:60]!r}")

    runs = run_methods(lm, segs, methods, max_new_tokens, prefix_cache=prefix_cache, on_run=said if progress else None)
    full = runs["full"]
    return {
        "task": sample.task, "length": sample.length, "sample": sample.index, "context_tokens": full.num_tokens,
        "chunks": len(sample.chunks), "question": sample.question, "expected": list(sample.expected),
        "metric": sample.metric,
        "methods": {m: {**against_full(r, full), "score": score_answer(sample, r.answer)} for m, r in runs.items()},
    }


def run_ruler(lm: LoadedModel, haystack_dir: str | Path, *, tasks: Sequence[str] | None = None,
              lengths: Sequence[int] = DEFAULT_LENGTHS, samples: int = 4, seed: int = 0,
              methods: Sequence[str] | str | None = None, chunk_tokens: int = 512,
              max_new_tokens: int | None = None, progress: Callable[[str], None] | None = None,
              prefix_cache: bool = True) -> dict:
    """Every (task, length, sample), every method. Returns ``{"config", "samples", "summary", "overall"}``.

    With ``prefix_cache`` (the engine's default) the linked methods link each prompt's leading
    text (template and task intro) from ``full``'s rows: :mod:`ragpic.engine.prefix`.

    A length that leaves no room for the answer in the model's context window is cut to
    ``context_window - max_new_tokens - 1`` (the sample records its real ``context_tokens``).
    ``max_new_tokens`` overrides each task's own answer budget.
    """
    methods = normalize_methods(methods, DEFAULT_METHODS)
    tasks = list(tasks or TASKS)
    haystack = load_haystack(haystack_dir)
    records = []
    for task in tasks:
        budget = max_new_tokens or TASKS[task].max_new_tokens
        for length in lengths:
            fit = min(length, lm.context_window - budget - 1)
            for i in range(samples):
                sample = generate_sample(lm.tokenizer, haystack, task, fit, i, seed=seed, chunk_tokens=chunk_tokens)
                rec = _run_sample(lm, sample, methods, budget, progress, f"{task} {length} [{i + 1}/{samples}]",
                                  prefix_cache)
                rec["length"] = length
                records.append(rec)
    return {"config": {"tasks": tasks, "lengths": list(lengths), "samples": samples, "seed": seed,
                       "methods": methods, "chunk_tokens": chunk_tokens, "max_new_tokens": max_new_tokens,
                       "prefix_cache": prefix_cache,
                       "task_max_new_tokens": {t: TASKS[t].max_new_tokens for t in tasks},
                       "model": lm.name, "fingerprint": lm.fingerprint, "dtype": str(lm.dtype),
                       "weights": str(lm.weights), "weights_summary": lm.weights_summary},
            **summaries(records, tasks, lengths, methods)}


def summaries(records: list[dict], tasks: Sequence[str], lengths: Sequence[int],
              methods: Sequence[str]) -> dict:
    """A result's ``samples``, ``summary`` (per cell) and ``overall`` (every sample): one shape for
    :func:`run_ruler` and for runs' samples pooled again (``benchmarks/pool_ruler.py``)."""
    return {"samples": records, "summary": summarize(records, tasks, lengths, methods),
            "overall": _aggregate(records, methods)}


def _aggregate(records: Sequence[dict], methods: Sequence[str]) -> dict[str, dict]:
    """Per method over ``records`` (samples that all ran every method)."""
    full = [r["methods"]["full"] for r in records]
    out = {}
    for m in methods:
        mine = [r["methods"][m] for r in records]
        scores = [x["score"] for x in mine]
        ratio, lo, hi = scoring.paired_ratio_ci(scores, [x["score"] for x in full])
        kls = [x["tf_kl_vs_full"] for x in mine]
        same = [x["same_as_full"] for x in mine]
        out[m] = {
            "samples": len(mine), "score": scoring.mean(scores), "score_ci95": list(scoring.bootstrap_ci(scores)),
            "score_ratio_vs_full": ratio, "score_ratio_vs_full_ci95": [lo, hi],
            "same_as_full": scoring.mean(same), "same_as_full_ci95": list(scoring.wilson_ci(same)),
            "tf_kl_vs_full": scoring.mean(kls), "tf_kl_vs_full_ci95": list(scoring.bootstrap_ci(kls)),
            "ttft_median_s": scoring.median([x["ttft_s"] for x in mine]),
            "ttft_ratio_vs_full": scoring.median([f["ttft_s"] / x["ttft_s"] for f, x in zip(full, mine)]),
            "recomputed_tokens": scoring.mean([x["recomputed_tokens"] for x in mine]),
            "context_tokens": scoring.mean([r["context_tokens"] for r in records]),
        }
    return out


def summarize(records: Sequence[dict], tasks: Sequence[str], lengths: Sequence[int],
              methods: Sequence[str]) -> dict[str, dict[str, dict]]:
    """``summary[task][str(length)][method]``: :func:`_aggregate` of that cell's samples; a
    (task, length) with no samples (pooled parts run at other lengths) is left out."""
    return {t: {str(n): _aggregate(cell, methods) for n in lengths
                if (cell := [r for r in records if r["task"] == t and r["length"] == n])} for t in tasks}


def format_table(result: dict) -> str:
    """One row per task, length and method; then the overall row per method."""
    head = (f"{'task':<17}{'length':>7}  {'method':<15}{'score':>6}{'/full':>7}  {'95% CI':<13}"
            f"{'same':>6}{'tf_kl':>8}{'speed-up':>10}")
    lines = [head, "-" * len(head)]

    def row(task: str, length: str, m: str, a: dict) -> str:
        lo, hi = a["score_ratio_vs_full_ci95"]
        ci = f"[{lo:.2f},{hi:.2f}]" if lo == lo and hi == hi else "-"  # NaN when full scored 0
        r = a["score_ratio_vs_full"]
        ratio = f"{r:>7.2f}" if r == r else f"{'-':>7}"
        return (f"{task:<17}{length:>7}  {m:<15}{a['score']:>6.2f}{ratio}  {ci:<13}{a['same_as_full']:>6.2f}"
                f"{a['tf_kl_vs_full']:>8.3f}{a['ttft_ratio_vs_full']:>9.1f}x")

    for task, by_len in result["summary"].items():
        for length, by_m in by_len.items():
            lines += [row(task, length, m, a) for m, a in by_m.items()]
    lines.append("-" * len(head))
    lines += [row("all", "", m, a) for m, a in result["overall"].items()]
    return "\n".join(lines)
