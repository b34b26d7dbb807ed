"""Where a RULER prompt's needles rank under ``qr``'s first-pass probe (docs/RESULTS.md §24).

``qr-<r>`` repairs the runs the question's attention ranks highest (``core/link/query_guided.py``).
This asks, per prompt, how much of the chunk tokens that ranking must take before it covers
every needle sentence (for vt every statement of the chain), under a few ways of reading the
probe: which layers' attention (the deeper half, as ``qr`` does; the last quarter; the middle
half; all) and how a run's tokens combine (sum, as ``qr`` does, or max). It also counts how
many of the best 5% of runs are the first run of a chunk (its attention-sink tokens). The first
pass is ``legolink-<k>``, as in ``qr-<r>-k<k>``; no second pass runs.

    python benchmarks/probe_ranks.py GGUF [TASKS] [SAMPLES] [K] [JSON]

(defaults ``vt`` and 8 samples at 4k of seed 0, the prompts of ``ragpic eval ruler``; ``K`` 1;
bf16, held dense weights, 2 threads). One JSON line per prompt on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch

from ragpic.core.runner import recompute_rows
from ragpic.core.link.hops import rank_runs
from ragpic.core.link.pieces import linker_for
from ragpic.core.link.plan import fill_cached_rows, new_cache
from ragpic.core.link.query_guided import chunk_spans, trailing_text_rows
from ragpic.core.model import load_model
from ragpic.core.ops.attention_probe import AttentionProbe
from ragpic.core.segments import concat_ids
from ragpic.eval.data import default_haystack, load_haystack
from ragpic.eval.ruler_tasks import generate_sample
from ragpic.eval.variants import compile_for, prompt_segments, variant_key


def needle_starts(tokenizer, ids: list[int], needles) -> list[int]:
    """The prompt position where each needle's tokens start (inner tokens: its edges may merge)."""
    out = []
    for text in needles:
        toks = tokenizer(text, add_special_tokens=False)["input_ids"]
        core = toks[1:-1] if len(toks) > 3 else toks
        hits = [p for p in range(len(ids) - len(core)) if ids[p:p + len(core)] == core]
        if hits:
            out.append(hits[0])
    return out


def ranking(score: torch.Tensor, runs, how: str) -> list[int]:
    """Run indices best first: ``sum`` is ``qr``'s own ranking (:func:`rank_runs`), ``max`` ranks
    by a run's most attended token (ties keep the earlier run, as there)."""
    if how == "sum":
        return rank_runs(score, runs)[1]
    best = [float(score[a:b].max()) for a, b in runs]
    return sorted(range(len(runs)), key=lambda j: -best[j])


def budget_to_cover(order: list[int], runs, starts: list[int], chunk_tokens: int) -> float:
    """Share of the chunk tokens the ranking ``order`` takes before every needle's run is in."""
    rank = {j: r for r, j in enumerate(order)}
    worst = max(rank[j] for p in starts for j, (a, b) in enumerate(runs) if a <= p < b)
    return sum(runs[j][1] - runs[j][0] for j in order[:worst + 1]) / chunk_tokens


def ruler_parser(doc: str, model_help: str = "the model file") -> argparse.ArgumentParser:
    """The arguments the RULER benchmarks share: the model file, ``--tasks``, ``--samples``, ``--seed``."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("gguf", help=model_help)
    p.add_argument("--tasks", default="niah_multivalue,vt", help="comma list of RULER tasks")
    p.add_argument("--samples", type=int, default=8, help="prompts per task (4k)")
    p.add_argument("--seed", type=int, default=0, help="RULER seed (0: the evaluation's prompts)")
    return p


def probed_first_pass(lm, haystack, task: str, sample: int, method: str, from_layer: int = 0, seed: int = 0):
    """RULER prompt ``sample`` of ``task`` (``seed``, 4k), its chunks compiled for ``method``, linked
    by ``method``'s first pass (``legolink-k``) with an :class:`AttentionProbe` on its trailing
    rows from layer ``from_layer``. Returns (the sample, its segments, ``(N,)`` ids, the first
    pass's ``(N,)`` bool mask, the probe)."""
    s = generate_sample(lm.tokenizer, haystack, task, min(4096, lm.context_window - 50), sample, seed=seed)
    kvs = compile_for(lm, [list(c.ids) for c in s.chunks], [method])
    segs = prompt_segments(lm.tokenizer, s.prefix, kvs[variant_key(method)], s.suffix, glue=None)
    ids = concat_ids(segs)
    first = linker_for(method).recompute(segs)
    probe = AttentionProbe(rows=trailing_text_rows(segs), from_layer=from_layer)
    with torch.inference_mode():
        cache = new_cache(lm, ids.numel(), None)
        fill_cached_rows(lm, cache, segs)
        recompute_rows(lm, cache, ids, first.nonzero().squeeze(1), ids.numel(), probe)
    return s, segs, ids, first, probe


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    tasks = (sys.argv[2] if len(sys.argv) > 2 else "vt").split(",")
    samples = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    k = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    torch.set_num_threads(2)
    lm = load_model(path, device="cpu", dtype="bfloat16", hold_dense=True)
    haystack = load_haystack(default_haystack())
    method = f"qr-5-k{k}"
    rows = []
    for task in tasks:
        for i in range(samples):
            s, segs, ids, first, probe = probed_first_pass(lm, haystack, task, i, method)
            per_layer = torch.stack([x.cpu() for x in probe.layers])  # (L, N)
            n_layers = per_layer.shape[0]
            runs = chunk_spans(segs)
            chunk_tokens = sum(b - a for a, b in runs)
            starts = needle_starts(lm.tokenizer, ids.tolist(), s.needles)
            row = {"task": task, "sample": i, "needles": len(s.needles), "found": len(starts)}
            for layers, sl in (("deep_half", slice(n_layers // 2, None)), ("last_quarter", slice(3 * n_layers // 4, None)),
                               ("middle", slice(n_layers // 4, 3 * n_layers // 4)), ("all", slice(None))):
                score = per_layer[sl].mean(0)
                for how in ("sum", "max"):
                    order = ranking(score, runs, how)
                    best = order[:math.ceil(0.05 * len(runs))]
                    row[f"{layers}/{how}"] = {
                        "budget_to_cover": round(budget_to_cover(order, runs, starts, chunk_tokens), 3) if starts else None,
                        "chunk_starts_in_top5pct": sum(1 for j in best if first[runs[j][0]])}
            print(json.dumps(row), flush=True)
            rows.append(row)
    if len(sys.argv) > 5:
        with open(sys.argv[5], "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
