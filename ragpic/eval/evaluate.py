"""``ragpic eval``: accuracy and fidelity to ``full`` of every link method on QA data.

For each question the passages are compiled once per compile recipe (``plain``, and
``bos4`` when ``legolink-0`` is asked for); every method then links the *same* token
sequence, answers greedily, and is teacher-forced with ``full``'s answer:

- gold F1 / EM (LongBench normalisation, max over gold answers);
- ``f1_vs_full``: F1 of the method's answer against ``full``'s answer;
- ``same_as_full``: answer identity with ``full``, the share of questions whose answer is
  ``full``'s after SQuAD normalisation (exact match of the two answers), with a Wilson 95%
  interval (``same_as_full_ci95``);
- ``top1_vs_full`` / ``cos_vs_full``: argmax agreement and cosine of the first-token logits;
- ``tf_top1_vs_full`` / ``tf_kl_vs_full``: feed ``full``'s answer (and the token after it)
  through the method's linked cache; per-position argmax agreement with ``full`` and
  KL(full || method), averaged per question, then over questions (bootstrap 95% interval
  over questions);
- ``ttft_median_s``: median link time (the prefill that precedes the first token; compile is
  done ahead of time and excluded, which is the point of PIC); ``ttft_ratio_vs_full`` is
  ``full``'s median divided by the method's (a speed-up: 10 means 10x faster).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ragpic.core.model import LoadedModel
from ragpic.core.segments import Segment
from ragpic.engine.offline import new_prefixes, request
from ragpic.engine.prefix import PrefixCache
from ragpic.eval import scoring
from ragpic.eval.data import GLUE, QA_INSTRUCTION, QAExample, qa_chunk_ids, template_parts
from ragpic.eval.plots import plot_eval
from ragpic.errors import ConfigError
from ragpic.eval.variants import (DEFAULT_METHODS, compile_for, head_ids, method_of, normalize_methods, opening_of,
                                  prompt_segments, variant_key)

__all__ = ["DEFAULT_METHODS", "EvalReport", "compile_for", "evaluate_qa", "format_table", "normalize_methods",
           "plot_eval", "prompt_segments", "qa_segments", "run_method", "run_methods"]

METRIC_KEYS = ("f1", "em", "f1_vs_full", "same_as_full", "top1_vs_full", "cos_vs_full", "tf_top1_vs_full",
               "tf_kl_vs_full", "ttft_median_s", "ttft_ratio_vs_full", "recomputed_tokens", "context_tokens")


@dataclass(slots=True)
class MethodRun:
    """One method on one prompt."""

    method: str
    answer: str
    answer_ids: list[int]
    first_logits: torch.Tensor
    tf_logits: torch.Tensor | None
    seconds: float
    recomputed: int
    num_tokens: int


def run_method(lm: LoadedModel, segments: Sequence[Segment], method: str, max_new_tokens: int,
               forced_ids: Sequence[int] | str | None = None, prefixes: PrefixCache | None = None) -> MethodRun:
    """Link, decode greedily, then teacher-force ``forced_ids`` (``"self"``: the method's own answer):
    the engine's :class:`~ragpic.engine.request.LinkedRequest`, as every entry point runs it
    (``prefixes``: the engine's prefix cache, :mod:`ragpic.engine.prefix`)."""
    req = request(lm, segments, method_of(method), max_new_tokens, extra_rows=1, prefixes=prefixes).link()
    first = req.first_logits
    g = req.run()
    tf = None
    if forced_ids is not None:
        tf = req.teacher_forced(g.token_ids if isinstance(forced_ids, str) else forced_ids)
    # link_rows: what the link forwarded (its cost), as the evaluations have always reported it
    return MethodRun(method, g.text.strip(), list(g.token_ids), first, tf, g.link_s, g.link_rows, g.prompt_tokens)


def against_full(run: MethodRun, full: MethodRun) -> dict:
    """``run``'s fidelity record against ``full``'s run on the same prompt (JSON-ready): its
    answer, answer identity with ``full``'s, teacher-forced KL(full || run) over ``full``'s
    answer (both runs teacher-forced on it), link seconds and recomputed rows."""
    return {"answer": run.answer, "same_as_full": scoring.exact_match(run.answer, full.answer),
            "tf_kl_vs_full": float(scoring.kl_divergence(full.tf_logits, run.tf_logits).mean()),
            "ttft_s": run.seconds, "recomputed_tokens": run.recomputed}


def run_methods(lm: LoadedModel, segs_by_recipe: dict[str, list[Segment]], methods: Sequence[str],
                max_new_tokens: int, teacher_force: bool = True, prefix_cache: bool = True,
                on_run: Callable[[str, MethodRun], None] | None = None) -> dict[str, MethodRun]:
    """Every method on the same prompt; ``full`` first, its answer teacher-forces the others.

    ``full``'s own reference rows come from the same teacher-forced forward as everyone
    else's (decode wrote those rows already; the forward rewrites them with the same tokens).
    With ``prefix_cache`` the others link the prompt's leading text from ``full``'s rows, as
    the engine links it from the last request's (:mod:`ragpic.engine.prefix`: exact).
    ``on_run(method, run)`` is called as each method finishes (progress).
    """
    prefixes = new_prefixes(lm, prefix_cache)
    runs: dict[str, MethodRun] = {}
    for m in ["full", *(m for m in methods if m != "full")]:
        forced = None if not teacher_force else "self" if m == "full" else runs["full"].answer_ids
        runs[m] = run_method(lm, segs_by_recipe[variant_key(m)], m, max_new_tokens, forced, prefixes)
        if on_run is not None:
            on_run(m, runs[m])
    return runs


def _f1_between(a: str, b: str) -> float:
    if not scoring.normalize_answer(a) and not scoring.normalize_answer(b):
        return 1.0
    return scoring.f1_score(a, b)


def question_scores(runs: dict[str, MethodRun], golds: Sequence[str]) -> dict[str, dict]:
    """Per-method scores of one question (fidelity against ``runs['full']``)."""
    full = runs["full"]
    out = {}
    for m, r in runs.items():
        s = {
            "answer": r.answer,
            "f1": scoring.max_over(scoring.f1_score, r.answer, golds),
            "em": scoring.max_over(scoring.exact_match, r.answer, golds),
            "f1_vs_full": _f1_between(r.answer, full.answer),
            "same_as_full": scoring.exact_match(r.answer, full.answer),
            "top1_vs_full": float(scoring.top1_agreement(full.first_logits, r.first_logits)),
            "cos_vs_full": scoring.cosine(full.first_logits, r.first_logits),
            "ttft_s": r.seconds,
            "recomputed_tokens": r.recomputed,
            "context_tokens": r.num_tokens,
        }
        if full.tf_logits is not None and r.tf_logits is not None:
            s["tf_top1_vs_full"] = float(scoring.top1_agreement(full.tf_logits, r.tf_logits).mean())
            s["tf_kl_vs_full"] = float(scoring.kl_divergence(full.tf_logits, r.tf_logits).mean())
        out[m] = s
    return out


def aggregate(per_question: Sequence[dict[str, dict]], methods: Sequence[str]) -> dict[str, dict]:
    """Means over questions (median for TTFT), ratios vs ``full``, bootstrap intervals."""
    out: dict[str, dict] = {}
    for m in methods:
        rows = [q[m] for q in per_question]
        agg = {}
        for key in ("f1", "em", "f1_vs_full", "same_as_full", "top1_vs_full", "cos_vs_full", "tf_top1_vs_full",
                    "tf_kl_vs_full", "recomputed_tokens", "context_tokens"):
            vals = [r[key] for r in rows if key in r]
            agg[key] = scoring.mean(vals)
        agg["ttft_median_s"] = scoring.median([r["ttft_s"] for r in rows])
        for key in ("tf_kl_vs_full", "tf_top1_vs_full", "f1"):
            vals = [r[key] for r in rows if key in r]
            agg[f"{key}_ci95"] = list(scoring.bootstrap_ci(vals))
        agg["same_as_full_ci95"] = list(scoring.wilson_ci([r["same_as_full"] for r in rows]))
        agg["questions"] = len(rows)
        out[m] = agg
    full_t = out["full"]["ttft_median_s"]
    for agg in out.values():
        agg["ttft_ratio_vs_full"] = full_t / agg["ttft_median_s"] if agg["ttft_median_s"] > 0 else float("nan")
    if "naive" in out:  # how much of naive's distance to full a method removes, paired over questions
        base = [q["naive"].get("tf_kl_vs_full") for q in per_question]
        for m in methods:
            mine = [q[m].get("tf_kl_vs_full") for q in per_question]
            if m not in ("full", "naive") and None not in mine and None not in base:
                ratio, lo, hi = scoring.paired_ratio_ci(mine, base)
                out[m]["tf_kl_ratio_vs_naive"] = ratio
                out[m]["tf_kl_ratio_vs_naive_ci95"] = [lo, hi]
    return out


def qa_segments(lm: LoadedModel, example: QAExample, methods: Sequence[str], *, chunk_tokens: int | None,
                passage_tokens: int | None) -> tuple[dict[str, list[Segment]], float]:
    """Compile an example's chunks (per recipe) and build its segments; returns (segs, compile s)."""
    before, after = template_parts(lm.tokenizer)
    chunk_ids = qa_chunk_ids(lm.tokenizer, example, chunk_tokens=chunk_tokens, passage_tokens=passage_tokens)
    prefix = before + QA_INSTRUCTION
    t0 = time.perf_counter()
    kvs = compile_for(lm, chunk_ids, methods, head=head_ids(lm.tokenizer, prefix),
                      opening=opening_of(lm.tokenizer, prefix, before))
    compile_s = time.perf_counter() - t0
    suffix = f"{GLUE}Question: {example.question}{after}"
    return {recipe: prompt_segments(lm.tokenizer, prefix, kv, suffix, glue=GLUE) for recipe, kv in kvs.items()}, compile_s


@dataclass(slots=True)
class EvalReport:
    methods: dict[str, dict]
    questions: list[dict] = field(default_factory=list)
    config: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"config": self.config, "methods": self.methods, "questions": self.questions}


def evaluate_qa(lm: LoadedModel, examples: Sequence[QAExample], methods: Sequence[str] | str | None = None, *,
                chunk_tokens: int | None = None, passage_tokens: int | None = None, max_new_tokens: int = 32,
                progress: Callable[[str], None] | None = None, prefix_cache: bool = True) -> EvalReport:
    """Run every method on every example; see the module docstring for the measures
    (``prefix_cache``: as :func:`run_methods`)."""
    methods = normalize_methods(methods)
    prev = [m for m in methods if "@prev" in m]
    if prev:  # its passages come from different articles: there is no document order to compile behind
        raise ConfigError(f"methods {prev}: '@prev<m>' compiles a chunk behind its document's chunks before it, and "
                          f"the QA evaluation's passages are separate articles; use it with 'eval ruler', 'eval "
                          f"needle' or 'bench'")
    per_q, records = [], []
    for i, ex in enumerate(examples):
        segs, compile_s = qa_segments(lm, ex, methods, chunk_tokens=chunk_tokens, passage_tokens=passage_tokens)
        runs = run_methods(lm, segs, methods, max_new_tokens, prefix_cache=prefix_cache)
        scores = question_scores(runs, ex.answers)
        per_q.append(scores)
        records.append({"question": ex.question, "answers": list(ex.answers), "compile_s": compile_s,
                        "methods": scores})
        if progress:
            progress(f"[{i + 1}/{len(examples)}] {scores['full']['context_tokens']} tokens, "
                     f"full: {scores['full']['answer'][:40]!r}")
    report = EvalReport(aggregate(per_q, methods), records)
    report.config = {"methods": methods, "questions": len(examples), "chunk_tokens": chunk_tokens,
                     "prefix_cache": prefix_cache,
                     "passage_tokens": passage_tokens, "max_new_tokens": max_new_tokens,
                     "model": lm.name, "fingerprint": lm.fingerprint, "dtype": str(lm.dtype),
                     "device": str(lm.device), "torch_threads": torch.get_num_threads()}
    return report


def format_table(methods: dict[str, dict]) -> str:
    """The readable stdout table."""
    head = (f"{'method':<15}{'f1':>6}{'em':>6}{'f1~full':>8}{'same':>6}{'top1':>6}{'cos':>7}{'tf_top1':>8}"
            f"{'tf_kl':>8}  {'tf_kl 95% CI':<15}{'ttft_s':>8}{'speedup':>8}{'recomp':>8}{'ctx':>7}")
    lines = [head, "-" * len(head)]
    for m, a in methods.items():
        ci = a.get("tf_kl_vs_full_ci95", [float("nan")] * 2)
        lines.append(
            f"{m:<15}{a['f1']:>6.3f}{a['em']:>6.3f}{a['f1_vs_full']:>8.3f}{a['same_as_full']:>6.2f}"
            f"{a['top1_vs_full']:>6.2f}"
            f"{a['cos_vs_full']:>7.3f}{a.get('tf_top1_vs_full', float('nan')):>8.3f}"
            f"{a.get('tf_kl_vs_full', float('nan')):>8.3f}  [{ci[0]:.3f},{ci[1]:.3f}]  "
            f"{a['ttft_median_s']:>8.3f}{a['ttft_ratio_vs_full']:>7.1f}x{a['recomputed_tokens']:>8.0f}"
            f"{a['context_tokens']:>7.0f}"
        )
    lines += ["", "answer = full's (share of questions, Wilson 95% CI)"]
    lines += [f"{m:<15}{a['same_as_full']:>6.2f}  [{a['same_as_full_ci95'][0]:.2f},{a['same_as_full_ci95'][1]:.2f}]"
              for m, a in methods.items() if m != "full" and "same_as_full_ci95" in a]
    paired = [(m, a) for m, a in methods.items() if "tf_kl_ratio_vs_naive" in a]
    if paired:
        lines += ["", "tf_kl / naive's tf_kl (paired bootstrap 95% CI over questions)"]
        lines += [f"{m:<15}{a['tf_kl_ratio_vs_naive']:>6.2f}  [{a['tf_kl_ratio_vs_naive_ci95'][0]:.2f},"
                  f"{a['tf_kl_ratio_vs_naive_ci95'][1]:.2f}]" for m, a in paired]
    return "\n".join(lines)
