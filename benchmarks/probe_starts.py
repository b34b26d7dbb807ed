"""Where the question's attention lands in chunk-start runs: the recomputed first token or the
stale ones after it (docs/RESULTS.md §25).

    python benchmarks/probe_starts.py <model .gguf or folder> [method, default qr-5-k1]

For one vt and one multi-value RULER prompt (4k, seed 0), runs ``method``'s first pass with the
probe over the deeper half of the layers (what ``qr`` ranks by) and prints the 16 best-scored
16-token runs: their summed score, whether the run starts a chunk, the score of its first token
and the highest score among its other tokens. bf16, held weights, 2 threads.
"""

from __future__ import annotations

import sys

import torch

from probe_ranks import probed_first_pass
from ragpic.core.link.query_guided import chunk_spans
from ragpic.core.model import load_model
from ragpic.core.segments import segment_starts
from ragpic.eval.data import default_haystack, load_haystack


def main() -> None:
    torch.set_num_threads(2)
    lm = load_model(sys.argv[1], device="cpu", dtype="bfloat16", hold_dense=True)
    method = sys.argv[2] if len(sys.argv) > 2 else "qr-5-k1"
    haystack = load_haystack(default_haystack())
    for task, index in (("vt", 0), ("niah_multivalue", 1)):
        _, segs, ids, _, probe = probed_first_pass(lm, haystack, task, index, method, lm.num_layers // 2)
        score = probe.scores().float()
        runs = chunk_spans(segs)
        weight = torch.tensor([float(score[a:b].sum()) for a, b in runs])
        starts = {a for seg, a in zip(segs, segment_starts(segs)) if seg.is_chunk}
        print(f"{task} sample {index}: attention units {float(score.sum()):.0f}")
        for r in weight.argsort(descending=True)[:16].tolist():
            a, b = runs[r]
            print(f"  {a:5d} {float(weight[r]):7.3f} {'START' if a in starts else '     '} first {float(score[a]):.3f} "
                  f"others' max {float(score[a + 1:b].max()):.3f} {lm.tokenizer.decode(ids[a:b])[:50]!r}")


if __name__ == "__main__":
    main()
