"""Recompute the first chunk's first rows too: the context's start, exact.

The leading text before the first chunk is recomputed (or linked from the prefix cache), so
the first chunk's rows are the only cached ones whose whole past can be made exact at the
cost of the rows themselves: recomputing its first ``F`` rows causally in the link's first
pass gives them exactly ``full``'s KV (everything before them is then exact). Tasks that read
the context from its start depend on them: common-word extraction, whose answer `full`
copies from the list's beginning and a linked cache copies for a few words and then loops on
one (docs/RESULTS.md §29), and a needle at depth 0.

Each recipe is a method with ``+f<F>`` (``legolink-16+f128``, ``qr-4-k4-h1-w-s+f64``): the
method's rows plus the first chunk's first ``F`` rows in its first pass; no suffix: the method
as the engine runs it. Every recipe links the same prompt side by side with ``full`` (whose
answer teacher-forces the others), as ``ragpic eval ruler`` does.

    python benchmarks/first_chunk.py GGUF [--tasks cwe] [--samples 4] [--seed 0] [--length 4096] \\
        [--recipes legolink-16,legolink-16+f128] [--json OUT]

(RULER prompts; bf16, held dense weights, 2 threads, the prefix cache as the engine's.)
One line per prompt and recipe, then per task and recipe: the mean score over ``full``'s, the
teacher-forced KL and the median link speed-up.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ragpic.core.link import linker_for
from ragpic.core.segments import Segment, segment_starts
from side_by_side import load, recipe_parser, report, side_by_side


def first_chunk_rows(segments: Sequence[Segment], rows: int) -> torch.Tensor:
    """``(N,)`` bool: the first ``rows`` rows of the first chunk after position 0 (the leading
    text linked from the prefix cache is a chunk at 0, exact already); none when no chunk."""
    mask = torch.zeros(sum(s.num_tokens for s in segments), dtype=torch.bool)
    for seg, start in zip(segments, segment_starts(segments)):
        if seg.is_chunk and start > 0:
            mask[start:start + min(rows, seg.num_tokens)] = True
            break
    return mask


def with_first_chunk(method: str, rows: int):
    """The engine's linker for ``method``, whose first pass also recomputes the first chunk's
    first ``rows`` rows (they run in position order with the method's own, so they are exact)."""
    linker = linker_for(method)
    base = linker.recompute

    def recompute(segments):
        return base(segments) | first_chunk_rows(segments, rows)

    linker.recompute = recompute  # this one object only: the benchmark's own linker
    return linker


def main() -> None:
    p = recipe_parser(__doc__, "legolink-16,legolink-16+f128",
                      "comma list: a method, with +f<F> to recompute the first chunk's first F rows too")
    p.set_defaults(tasks="cwe", samples=4)
    args = p.parse_args()
    lm = load(args.gguf)
    recipes = [(r, *r.partition("+f")[::2]) for r in args.recipes.split(",")]
    first = {r: int(f) for r, _, f in recipes if f}
    tasks = args.tasks.split(",")
    records = side_by_side(lm, tasks, args.samples, args.seed, args.length, [(r, m) for r, m, _ in recipes],
                           lambda name, m, _: with_first_chunk(m, first[name]) if name in first else None)
    report(records, tasks, [r for r, _, _ in recipes], args)


if __name__ == "__main__":
    main()
