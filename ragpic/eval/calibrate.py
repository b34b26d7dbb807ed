"""``ragpic calibrate``: measure each link recipe's share of ``full`` on one model, once, for ``auto``.

The calibration set is RULER-style prompts (:mod:`ragpic.eval.ruler_tasks`) generated from
:data:`CALIBRATION_SEED`, a seed no evaluation uses, plus the first questions of the bundled
MuSiQue sample (passages cut to 192 tokens, as the documented ``ragpic eval`` run does). Every
recipe links the same ids as ``full``, side by side in one run, so its speed-up is measured
against ``full`` on the same prompts and machine. Per task the score is
RULER's (share of expected values found) or MuSiQue's gold F1; a recipe's share is its mean
over the task's prompts divided by ``full``'s. The result is written beside the converted
models, keyed by the model's fingerprint (:func:`ragpic.engine.calibration.save_calibration`),
where ``Config(method="auto")`` finds it.

With ``behind=m`` each recipe also runs as ``<recipe>@prev<m>`` on the RULER prompts (one
document each, its chunks in order: each compiled behind the ``m`` chunks before it, as
``Config(compile_behind=m)`` stores them; ``head="chat"``: after the prompt's chat opening,
``<recipe>@chat@prev<m>``, as under ``compile_head=True``; ``head="head"``: after its whole
leading text, as under ``compile_head=<text>``);
MuSiQue's passages are separate articles, so those rows have no MuSiQue share. ``auto`` picks
among them for the prompts that link their chunks from such entries
(:func:`ragpic.engine.calibration.choose`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from ragpic.core.model import LoadedModel
from ragpic.engine.calibration import Calibration, RecipeScore, choose
from ragpic.eval import scoring
from ragpic.eval.data import QAExample, default_dataset, default_haystack, load_qa
from ragpic.eval.evaluate import evaluate_qa
from ragpic.eval.ruler import run_ruler
from ragpic.eval.ruler_tasks import TASKS
from ragpic.core.methods import PRESETS, parse_variant
from ragpic.eval.variants import normalize_methods

__all__ = ["CALIBRATION_SEED", "DEFAULT_RECIPES", "format_calibration", "run_calibration"]

CALIBRATION_SEED = 20261204
"""RULER prompts of the calibration set: the evaluations use seed 0. One check ran prompts of
this seed at 4k (docs/RESULTS.md §26, held out from the evaluation's, not from this set: the
calibration's are 2k); a check held out from both needs a seed of its own."""

DEFAULT_RECIPES = tuple(PRESETS)
"""The presets (:data:`ragpic.core.methods.PRESETS`): what ``auto`` chooses among."""


def _shares(full: Sequence[float], mine: Sequence[float]) -> float | None:
    f = scoring.mean(full)
    return None if f == 0 else scoring.mean(mine) / f


def run_calibration(lm: LoadedModel, *, recipes: Sequence[str] = DEFAULT_RECIPES,
                    tasks: Sequence[str] | None = None, lengths: Sequence[int] = (2048,), samples: int = 2,
                    musique: int = 8, seed: int = CALIBRATION_SEED, qa: Sequence[QAExample] | None = None,
                    max_new_tokens: int | None = None, chunk_tokens: int = 512, passage_tokens: int | None = 192,
                    progress: Callable[[str], None] | None = None, prefix_cache: bool = True,
                    behind: int = 0, head: str = "") -> Calibration:
    """Run the calibration set with ``full`` and every recipe; returns the :class:`Calibration`.

    ``musique``: how many of the bundled MuSiQue questions (0: none); ``qa``: other QA examples
    instead (task ``qa``); ``max_new_tokens``: every answer's budget (default: each task's own);
    ``chunk_tokens``: the RULER prompts' chunk size; ``passage_tokens``: each QA passage cut to
    this many tokens (192: the documented ``ragpic eval`` run's ~2k-token prompts; ``None``: whole,
    ~6k tokens and 3x the time); ``prefix_cache``: the recipes link each prompt's leading text
    from ``full``'s rows, as the engine does by default, so the speed-ups are the engine's.
    ``behind``: also run every recipe on chunks compiled behind this many before them (0: not),
    after the prompt's ``head`` (``""``: nothing; ``"chat"``: its chat opening; ``"head"``: its
    whole leading text).
    """
    if head not in ("", "chat", "head"):
        raise ValueError(f"head must be '', 'chat' or 'head', got {head!r}")
    alone = normalize_methods(recipes, ())  # canonical names, full first: run_ruler's keys
    in_order = [replace(parse_variant(m), behind=behind, head=head) for m in alone[1:] if behind]
    methods = alone + [v.name for v in in_order]  # the variants' one spelling (core Variant.name)
    recipes = methods[1:]
    tasks = list(tasks or TASKS)
    ruler = run_ruler(lm, default_haystack(), tasks=tasks, lengths=lengths, samples=samples, seed=seed,
                      methods=methods, chunk_tokens=chunk_tokens, max_new_tokens=max_new_tokens, progress=progress,
                      prefix_cache=prefix_cache)
    scores = {t: {m: [r["methods"][m]["score"] for r in ruler["samples"] if r["task"] == t] for m in methods}
              for t in tasks}
    times = {m: [r["methods"][m]["ttft_s"] for r in ruler["samples"]] for m in methods}
    examples = qa if qa is not None else load_qa(default_dataset(), limit=musique) if musique else []
    if examples:
        report = evaluate_qa(lm, examples, alone, passage_tokens=passage_tokens, progress=progress,
                             prefix_cache=prefix_cache,
                             **({"max_new_tokens": max_new_tokens} if max_new_tokens else {}))
        name = "qa" if qa is not None else "musique"
        scores[name] = {m: [q["methods"][m]["f1"] for q in report.questions] for m in alone}
        for m in alone:
            times[m] += [q["methods"][m]["ttft_s"] for q in report.questions]
    speedup = {m: scoring.median([f / t for f, t in zip(times["full"], times[m])]) for m in recipes}
    return Calibration(
        fingerprint=lm.fingerprint, model=lm.name, source_sha256=lm.source_sha256, made=machine_facts(lm),
        full_scores={t: scoring.mean(s["full"]) for t, s in scores.items()},
        recipes=[RecipeScore(m, {t: _shares(s["full"], s[m]) for t, s in scores.items() if m in s}, speedup[m])
                 for m in recipes],
        setup={"seed": seed, "tasks": tasks, "lengths": list(lengths), "samples": samples,
               "behind": behind, "head": head,
               "qa": len(examples), "qa_set": "given" if qa is not None else "musique", "passage_tokens": passage_tokens,
               "dtype": str(lm.dtype), "device": str(lm.device), "prefix_cache": prefix_cache},
    )


def machine_facts(lm: LoadedModel) -> dict:
    """Where a calibration was measured, for its reader: the CPU (or GPU), torch's kernel level,
    threads and the date (speed-ups depend on all of them)."""
    import datetime
    import platform

    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in _read_lines("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor() or platform.machine())
    device = torch.cuda.get_device_name(lm.device) if lm.device.type == "cuda" else cpu
    return {"machine": f"{device}, {torch.get_num_threads()} threads, torch {torch.__version__} "
                       f"({torch.backends.cpu.get_cpu_capability()})",
            "date": datetime.date.today().isoformat()}


def _read_lines(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.read().splitlines()
    except OSError:
        return []


def format_calibration(cal: Calibration, fidelity: float) -> str:
    """One row per recipe: share of ``full`` per task (``*``: a task ``full`` can do), worst share, speed-up;
    then what ``auto`` picks at ``fidelity``."""
    tasks = list(cal.full_scores)
    can = set(cal.tasks_full_can_do())
    w = max(16, *(len(r.name) + 2 for r in cal.recipes))
    head = (f"{'recipe':<{w}}" + "".join(f"{t + ('*' if t in can else ''):>17}" for t in tasks)
            + f"{'worst*':>8}{'speed-up':>10}")
    lines = [head, "-" * len(head),
             f"{'full (score)':<{w}}" + "".join(f"{cal.full_scores[t]:>17.2f}" for t in tasks) + f"{'':>8}{1.0:>9.1f}x"]
    for r in cal.recipes:
        cells = "".join(f"{'' if t not in r.shares else '-' if r.shares[t] is None else format(r.shares[t], '.0%'):>17}"
                        for t in tasks)
        lines.append(f"{r.name:<{w}}{cells}{cal.worst_share(r):>8.0%}{r.speedup:>9.1f}x")
    lines += ["-" * len(head), "* a task full can do (full scores >= 0.5 there): the shares auto is held to",
              choose(cal, fidelity).reason + f" [fidelity {fidelity}]"]
    if any(r.behind for r in cal.recipes):
        lines.append(choose(cal, fidelity, behind=True).reason + f" [fidelity {fidelity}]")
    return "\n".join(lines)
