"""RULER prompts linked by candidate linkers beside ``full``: what the recipe benchmarks share.

A candidate that is not a method the engine knows (a linker a benchmark builds: a late start,
extra rows) is run through :func:`run_linker`; every recipe links the same prompt as ``full``,
whose answer teacher-forces the others, as ``ragpic eval ruler`` does (bf16, held dense weights,
the prefix cache as the engine's). Used by ``late_start.py`` and ``first_chunk.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Sequence

import torch

from probe_ranks import ruler_parser
from ragpic.core.decode import Sampling
from ragpic.core.link import Linker
from ragpic.core.model import LoadedModel, load_model
from ragpic.engine.offline import new_prefixes
from ragpic.engine.request import LinkedRequest
from ragpic.eval.data import default_haystack, load_haystack
from ragpic.eval.evaluate import MethodRun, against_full, run_method
from ragpic.eval.ruler import score_answer
from ragpic.eval.ruler_tasks import TASKS, generate_sample
from ragpic.eval.variants import compile_for, prompt_segments, variant_key

LinkerOf = Callable[[str, str, list[list[int]]], Linker | None]
"""``(recipe name, its method, the prompt's chunk ids) -> a linker``, or None: the method as the engine runs it."""


def recipe_parser(doc: str, recipes: str, recipes_help: str) -> argparse.ArgumentParser:
    """:func:`ruler_parser`'s arguments, ``--length``, ``--recipes`` (default ``recipes``) and ``--json``."""
    p = ruler_parser(doc)
    p.add_argument("--length", type=int, default=4096, help="prompt tokens")
    p.add_argument("--recipes", default=recipes, help=recipes_help)
    p.add_argument("--json", default=None, help="write every record here")
    return p


def load(path: str) -> LoadedModel:
    """The model as the RESULTS runs load it: bf16, held dense weights, 2 threads."""
    torch.set_num_threads(2)
    return load_model(path, device="cpu", dtype="bfloat16", hold_dense=True)


def run_linker(lm: LoadedModel, segs, linker: Linker, budget: int, forced, prefixes) -> MethodRun:
    """:func:`~ragpic.eval.evaluate.run_method` with a :class:`Linker` in place of a method name
    (the evaluations take only names and types from the core, ``tests/test_layout.py``, so a
    linker a benchmark builds is run here)."""
    req = LinkedRequest(lm, segs, linker, Sampling(max_new_tokens=budget), extra_rows=1, prefixes=prefixes).link()
    first = req.first_logits
    g = req.run()
    tf = req.teacher_forced(forced)
    return MethodRun(linker.name, g.text.strip(), list(g.token_ids), first, tf, g.link_s, g.link_rows, g.prompt_tokens)


def side_by_side(lm: LoadedModel, tasks: Sequence[str], samples: int, seed: int, length: int,
                 recipes: Sequence[tuple[str, str]], linker_of: LinkerOf) -> list[dict]:
    """One record per prompt: ``full``'s score and answer, and per recipe ``(name, method)`` its
    score, speed-up over ``full``, rows, answer and agreement with ``full`` (printed as it goes)."""
    haystack = load_haystack(default_haystack())
    records = []
    for task in tasks:
        budget = TASKS[task].max_new_tokens
        for i in range(samples):
            s = generate_sample(lm.tokenizer, haystack, task, min(length, lm.context_window - budget - 1), i,
                                seed=seed)
            chunks = [list(c.ids) for c in s.chunks]
            methods = ["full", *dict.fromkeys(m for _, m in recipes)]
            kvs = compile_for(lm, chunks, methods)
            prefixes = new_prefixes(lm)
            segs = {m: prompt_segments(lm.tokenizer, s.prefix, kvs[variant_key(m)], s.suffix, glue=None)
                    for m in methods}
            full = run_method(lm, segs["full"], "full", budget, "self", prefixes)
            row = {"task": task, "sample": i, "full": score_answer(s, full.answer), "full_answer": full.answer}
            for name, m in recipes:
                linker = linker_of(name, m, chunks)
                run = (run_method(lm, segs[m], m, budget, full.answer_ids, prefixes) if linker is None
                       else run_linker(lm, segs[m], linker, budget, full.answer_ids, prefixes))
                row[name] = {**against_full(run, full), "score": score_answer(s, run.answer),
                             "speedup": full.seconds / run.seconds, "rows": run.recomputed, "answer": run.answer}
                print(f"{task} [{i + 1}] {name}: score {row[name]['score']:.2f} (full {row['full']:.2f}) "
                      f"{row[name]['speedup']:.1f}x rows {run.recomputed} {run.answer[:50]!r}", flush=True)
            records.append(row)
    return records


def report(records: Sequence[dict], tasks: Sequence[str], names: Sequence[str],
           args: argparse.Namespace | None = None) -> None:
    """Every record written to ``args.json`` when it is set, then printed per task and recipe:
    the mean score over ``full``'s, the mean TF KL, the median speed-up."""
    if args is not None and args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "records": records}, f, indent=1)
    for task in tasks:
        mine = [r for r in records if r["task"] == task]
        full = statistics.mean(r["full"] for r in mine) or float("nan")
        for name in names:
            share = statistics.mean(r[name]["score"] for r in mine) / full
            speed = statistics.median(r[name]["speedup"] for r in mine)
            kl = statistics.mean(r[name]["tf_kl_vs_full"] for r in mine)
            print(f"{task:<18}{name:<28}{share:7.0%}  KL {kl:.3f}  {speed:5.1f}x")
