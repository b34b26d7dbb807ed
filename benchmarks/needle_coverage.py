"""How much of each needle a ``qr`` selection covers, before any second pass (docs/RESULTS.md §26).

Per RULER prompt: ``qr-<r>-k4``'s first pass with the probe (the deeper half of the layers, as
``qr`` reads it), then several selections from the same scores, each reported as the mean share
of the needle sentences' tokens it repairs (for vt: the chain's statements). It separates a
selection miss (the needle's run never chosen) from a repair miss (chosen, and still answered
wrong). Variants: hops ``-h1`` with and without the question's words (``-w``) at a few
``QUESTION_RUNS`` thresholds, ``-w`` without hops, the sentence runs of ``-s``
(``ragpic/core/link/sentences.py``) with and without ``-w``, and ``-w-s`` with two and three
hop rounds (docs/RESULTS.md §30). Per task and variant: the mean coverage, and the mean number
of needles a prompt leaves under half covered.

    python benchmarks/needle_coverage.py GGUF [--tasks niah_multivalue,vt] [--samples 8] [--seed 0] [--budgets 0.04,0.06]

(prompts at 4k of seed 0, the evaluation's, unless ``--seed``; bf16, held dense weights, 2 threads). One JSON line per prompt, then the means per task and variant.
"""

from __future__ import annotations

import json

import torch

from probe_ranks import needle_starts, probed_first_pass, ruler_parser
from ragpic.core.link.hops import select_with_hops
from ragpic.core.link.query_guided import PROBE_FROM_LAYER, chunk_spans, trailing_text_rows
from ragpic.core.link.sentences import sentence_ends, sentence_spans
from ragpic.core.model import load_model
from ragpic.eval.data import default_haystack, load_haystack

FIRST = "qr-5-k4"  # the first pass (legolink-4) every variant shares
VARIANTS = (("-h1", 1, 0, False), ("-h1-w, words in <= 4 runs", 1, 4, False), ("-h1-w, <= 8 runs", 1, 8, False),
            ("-h1-w, <= 16 runs", 1, 16, False), ("-w alone, <= 8 runs", 0, 8, False),
            ("-h1-s", 1, 0, True), ("-h1-w-s", 1, 4, True), ("-h2-w-s", 2, 4, True), ("-h3-w-s", 3, 4, True))


def main() -> None:
    p = ruler_parser(__doc__, "the model file (Qwen2.5-Coder-1.5B-Instruct's Q4_K_M in docs/RESULTS.md §26)")
    p.add_argument("--budgets", default="0.04,0.06", help="comma list of budgets r, as fractions")
    args = p.parse_args()
    tasks, budgets = args.tasks.split(","), [float(b) for b in args.budgets.split(",")]
    torch.set_num_threads(2)
    lm = load_model(args.gguf, device="cpu", dtype="bfloat16", hold_dense=True)
    haystack = load_haystack(default_haystack())
    means: dict[tuple[str, str], list[float]] = {}
    for task in tasks:
        for i in range(args.samples):
            s, segs, ids, first, probe = probed_first_pass(lm, haystack, task, i, FIRST,
                                                           int(PROBE_FROM_LAYER * lm.num_layers), args.seed)
            n, tail = ids.numel(), trailing_text_rows(segs)
            starts = needle_starts(lm.tokenizer, ids.tolist(), s.needles)
            lengths = [len(lm.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in s.needles]
            scores, question = probe.scores().cpu(), ids[n - tail:].tolist()
            plain, sentences = chunk_spans(segs), sentence_spans(segs, sentence_ends(lm.tokenizer, ids))
            row = {"task": task, "sample": i, "needles": len(s.needles), "found": len(starts)}
            for budget in budgets:
                for name, hops, words, whole in VARIANTS:
                    chosen = select_with_hops(scores, sentences if whole else plain, budget, ids, hops,
                                              question if words else (), question_runs=words,
                                              whole_runs=whole) | first
                    cover = [float(chosen[p:p + k].float().mean()) for p, k in zip(starts, lengths)]
                    key = f"{budget:.0%} {name}"
                    row[key] = round(sum(cover) / max(len(cover), 1), 3)
                    means.setdefault((task, key), []).append(row[key])
                    # a needle (a vt statement) under half repaired: a selection miss
                    missed = row[f"{key}, needles < 50% covered"] = sum(c < 0.5 for c in cover)
                    means.setdefault((task, f"{key}, needles < 50% covered"), []).append(missed)
            print(json.dumps(row), flush=True)
    for (task, key), values in means.items():
        print(f"{task:<18}{key:<32}{sum(values) / len(values):.3f}")


if __name__ == "__main__":
    main()
