"""APE's attention temperature on cached context, fitted once per model without labels, then
measured on the RULER-style tasks (docs/RESULTS.md §15). A candidate, not a method.

Every cached chunk's keys are multiplied by ``s`` before the link (RoPE is linear, so the
re-rotated keys are scaled too); rows the link recomputes keep their own keys. Every query's
logits over the cached context are then ``s`` times sharper, in every layer, with no kernel
change. ``s`` is fitted without labels, as APE fits it: the one of ``--temperatures`` that
minimises the teacher-forced KL(full || method) over ``full``'s greedy answers on a
**calibration** set, RULER-style samples of ``--calib-seed`` (a different seed from the
evaluation's, so no calibration prompt is an evaluation prompt). The fitted ``s`` is then run
beside ``s = 1`` on the evaluation set (``--seed``), scored as ``ragpic eval ruler`` scores.

    python benchmarks/ape_temperature.py --model $M --method legolink-16 \\
        --temperatures 0.8,0.9,0.95,1.0,1.05,1.1,1.2 --calib-length 2048 --length 4096 \\
        --tasks niah_multivalue,niah_multiquery,vt,cwe --threads 2 --json docs/results/ape_temperature_qwen05b.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import torch

from ragpic.core.link import link
from ragpic.core.methods import parse_method
from ragpic.core.model import LoadedModel, load_model
from ragpic.core.segments import Segment
from ragpic.eval import scoring
from ragpic.eval.data import default_haystack, load_haystack
from ragpic.eval.evaluate import against_full, run_method, teacher_forced_logits
from ragpic.eval.ruler import score_answer
from ragpic.eval.ruler_tasks import TASKS, generate_sample
from ragpic.eval.variants import prompt_segments, compile_for


def scaled(segments: list[Segment], s: float) -> list[Segment]:
    """The same prompt with every cached chunk's keys times ``s`` (int8 KV: its key scales)."""
    if s == 1.0:
        return segments
    out = []
    for seg in segments:
        if seg.kv is not None:
            kv = seg.kv
            kv = (dataclasses.replace(kv, key_scales=kv.key_scales * s) if kv.key_scales is not None
                  else dataclasses.replace(kv, keys=kv.keys * s))
            seg = dataclasses.replace(seg, kv=kv)
        out.append(seg)
    return out


@torch.inference_mode()
def tf_kl(lm: LoadedModel, segs: list[Segment], method: str, ref_logits: torch.Tensor, forced: list[int]) -> float:
    res = link(lm, segs, method, extra_capacity=len(forced) + 1)
    return float(scoring.kl_divergence(ref_logits, teacher_forced_logits(lm, res, forced)).mean())


def prompt(lm: LoadedModel, haystack: str, task: str, length: int, index: int, seed: int, method: str):
    sample = generate_sample(lm.tokenizer, haystack, task, length, index, seed=seed)
    kvs = compile_for(lm, [list(c.ids) for c in sample.chunks], ["full", method])
    return sample, {r: prompt_segments(lm.tokenizer, sample.prefix, kv, sample.suffix, glue=None) for r, kv in kvs.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--dtype", default=None)
    p.add_argument("--method", default="legolink-16")
    p.add_argument("--temperatures", default="0.8,0.9,0.95,1.0,1.05,1.1,1.2")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--calib-seed", type=int, default=1)
    p.add_argument("--calib-length", type=int, default=2048)
    p.add_argument("--calib-samples", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    lm = load_model(a.model, dtype=a.dtype)
    kind = parse_method(a.method).recipe
    haystack = load_haystack(default_haystack())
    temps = [float(t) for t in a.temperatures.split(",")]
    tasks = a.tasks.split(",")
    t0 = time.perf_counter()

    kls = {s: [] for s in temps}
    for task in tasks:
        for i in range(a.calib_samples):
            sample, segs = prompt(lm, haystack, task, a.calib_length, i, a.calib_seed, a.method)
            full = run_method(lm, segs["plain"], "full", TASKS[task].max_new_tokens, "self")
            for s in temps:
                kls[s].append(tf_kl(lm, scaled(segs[kind], s), a.method, full.tf_logits, full.answer_ids))
            print(f"[calib {time.perf_counter() - t0:.0f}s] {task} {i}: "
                  + " ".join(f"s={s}: {kls[s][-1]:.3f}" for s in temps), file=sys.stderr)
    calib = {s: scoring.mean(v) for s, v in kls.items()}
    best = min(temps, key=lambda s: (calib[s], abs(s - 1)))
    print(f"calibration KL per s: {calib}; fitted s = {best}", file=sys.stderr)

    arms = [1.0] if best == 1.0 else [1.0, best]
    records = []
    for task in tasks:
        for i in range(a.samples):
            sample, segs = prompt(lm, haystack, task, a.length, i, a.seed, a.method)
            max_new = TASKS[task].max_new_tokens
            full = run_method(lm, segs["plain"], "full", max_new, "self")
            rec = {"task": task, "sample": i, "full": {"answer": full.answer, "score": score_answer(sample, full.answer)}}
            for s in arms:
                run = run_method(lm, scaled(segs[kind], s), a.method, max_new, full.answer_ids)
                rec[f"s={s}"] = {**against_full(run, full), "score": score_answer(sample, run.answer),
                                 "speedup": full.seconds / run.seconds}
            records.append(rec)
            print(f"[eval {time.perf_counter() - t0:.0f}s] {task} {i}: full {rec['full']['score']:.2f} "
                  + " ".join(f"s={s}: {rec[f's={s}']['score']:.2f} (KL {rec[f's={s}']['tf_kl_vs_full']:.3f})"
                             for s in arms), file=sys.stderr)

    summary = {}
    for task in tasks + ["all"]:
        rows = [r for r in records if task in ("all", r["task"])]
        full = [r["full"]["score"] for r in rows]
        summary[task] = {"full": scoring.mean(full)}
        for s in arms:
            sc = [r[f"s={s}"]["score"] for r in rows]
            summary[task][f"s={s}"] = {"score": scoring.mean(sc), "ratio_ci95": scoring.paired_ratio_ci(sc, full),
                                       "tf_kl": scoring.mean([r[f"s={s}"]["tf_kl_vs_full"] for r in rows])}
    for task, row in summary.items():
        print(f"{task:16s} full {row['full']:.2f}  " + "  ".join(
            f"s={s}: {row[f's={s}']['score']:.2f} KL {row[f's={s}']['tf_kl']:.3f}" for s in arms))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": vars(a), "calibration_kl": {str(s): v for s, v in calib.items()}, "fitted": best,
                       "summary": summary, "samples": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
