"""How much of each needle a ``qr`` selection covers, before any second pass (docs/RESULTS.md §26).

Per RULER prompt: ``qr-<r>-k4``'s first pass with the probe (the deeper half of the layers, as
``qr`` reads it), then several selections from the same scores, each reported as the mean share
of the needle sentences' tokens it repairs (for vt: the chain's statements). It separates a
selection miss (the needle's run never chosen) from a repair miss (chosen, and still answered
wrong). Variants: hops ``-h1`` with and without the question's words (``-w``) at a few
``QUESTION_RUNS`` thresholds, and ``-w`` without hops.

    python benchmarks/needle_coverage.py GGUF [TASKS] [SAMPLES] [BUDGETS]

(defaults ``niah_multivalue,vt``, 8 samples at 4k of seed 0, budgets ``0.04,0.06``; bf16, held
dense weights, 2 threads). One JSON line per prompt, then the means per task and variant.
"""

from __future__ import annotations

import json
import sys

import torch

from probe_ranks import needle_starts
from ragpic.core.forward import recompute_rows
from ragpic.core.link.hops import select_with_hops
from ragpic.core.link.pieces import linker_for
from ragpic.core.link.plan import fill_cached_rows, new_cache
from ragpic.core.link.query_guided import PROBE_FROM_LAYER, chunk_spans, trailing_text_rows
from ragpic.core.model import load_model
from ragpic.core.ops.attention_probe import AttentionProbe
from ragpic.core.segments import concat_ids
from ragpic.eval.data import default_haystack, load_haystack
from ragpic.eval.ruler_tasks import generate_sample
from ragpic.eval.variants import compile_for, prompt_segments, variant_key

FIRST = "qr-5-k4"  # the first pass (legolink-4) every variant shares
VARIANTS = (("-h1", 1, 0), ("-h1-w, words in <= 4 runs", 1, 4), ("-h1-w, <= 8 runs", 1, 8),
            ("-h1-w, <= 16 runs", 1, 16), ("-w alone, <= 8 runs", 0, 8))


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    tasks = (sys.argv[2] if len(sys.argv) > 2 else "niah_multivalue,vt").split(",")
    samples = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    budgets = [float(b) for b in (sys.argv[4] if len(sys.argv) > 4 else "0.04,0.06").split(",")]
    torch.set_num_threads(2)
    lm = load_model(path, device="cpu", dtype="bfloat16", hold_dense=True)
    haystack = load_haystack(default_haystack())
    means: dict[tuple[str, str], list[float]] = {}
    for task in tasks:
        for i in range(samples):
            s = generate_sample(lm.tokenizer, haystack, task, min(4096, lm.context_window - 50), i, seed=0)
            kvs = compile_for(lm, [list(c.ids) for c in s.chunks], [FIRST])
            segs = prompt_segments(lm.tokenizer, s.prefix, kvs[variant_key(FIRST)], s.suffix, glue=None)
            ids = concat_ids(segs)
            n, tail = ids.numel(), trailing_text_rows(segs)
            starts = needle_starts(lm.tokenizer, ids.tolist(), s.needles)
            lengths = [len(lm.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in s.needles]
            first = linker_for(FIRST).recompute(segs)
            probe = AttentionProbe(rows=tail, from_layer=int(PROBE_FROM_LAYER * lm.num_layers))
            with torch.inference_mode():
                cache = new_cache(lm, n, None)
                fill_cached_rows(lm, cache, segs)
                recompute_rows(lm, cache, ids, first.nonzero().squeeze(1), n, probe)
            scores, runs, question = probe.scores().cpu(), chunk_spans(segs), ids[n - tail:].tolist()
            row = {"task": task, "sample": i, "needles": len(s.needles), "found": len(starts)}
            for budget in budgets:
                for name, hops, words in VARIANTS:
                    chosen = select_with_hops(scores, runs, budget, ids, hops, question if words else (),
                                              question_runs=words) | first
                    cover = [float(chosen[p:p + k].float().mean()) for p, k in zip(starts, lengths)]
                    key = f"{budget:.0%} {name}"
                    row[key] = round(sum(cover) / max(len(cover), 1), 3)
                    means.setdefault((task, key), []).append(row[key])
            print(json.dumps(row), flush=True)
    for (task, key), values in means.items():
        print(f"{task:<18}{key:<32}{sum(values) / len(values):.3f}")


if __name__ == "__main__":
    main()
