"""Fidelity vs speed-up of every link method, from the JSON of ``ragpic eval`` and ``ragpic eval needle``.

    python benchmarks/pareto.py --eval docs/results/eval_qr.json --needle docs/results/needle_qr.json --out docs/results/pareto.png

Reads the runs' own figures (TF KL with its bootstrap interval, needle hits where ``full``
hits, and each method's median link time relative to ``full`` in the same run); draws
docs/results/pareto.png and prints the points.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from plots import plot_pareto  # benchmarks/plots.py: the script's folder is on sys.path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--eval", type=Path, help="ragpic eval --json output")
    p.add_argument("--needle", type=Path, help="ragpic eval needle --json output")
    p.add_argument("--out", type=Path, required=True, help="PNG to write")
    args = p.parse_args(argv)
    if args.eval is None and args.needle is None:
        p.error("give --eval, --needle or both")
    ev = json.loads(args.eval.read_text()) if args.eval else None
    nd = json.loads(args.needle.read_text()) if args.needle else None
    if ev:
        for m, a in ev["methods"].items():
            print(f"musique {m:<15} speed-up {a['ttft_ratio_vs_full']:6.1f}x  TF KL {a['tf_kl_vs_full']:.3f}")
    if nd:
        for m, s in nd["summary"].items():
            print(f"needle  {m:<15} speed-up {s['ttft_ratio_vs_full']:6.1f}x  hits {s['hits_where_full_hits']}/"
                  f"{s['full_hit_cells']}")
    print(f"wrote {plot_pareto(ev, nd, args.out)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
