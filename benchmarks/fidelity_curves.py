"""One model's fidelity against speed: accuracy ratio to ``full`` vs link speed-up, per method.

    python benchmarks/fidelity_curves.py --model "Qwen2.5-Coder-0.5B" \\
        --needle docs/results/needle_qwen05b.json,docs/results/needle_qwen05b_8k.json --musique docs/results/eval_qwen05b.json \\
        --ruler docs/results/ruler_qwen05b_4k.json,docs/results/ruler_qp_qwen05b_4k.json --out docs/results/fidelity_qwen05b.png

Reads the runs' own figures (``ragpic eval needle``, ``ragpic eval``, ``ragpic eval ruler``
JSON; several needle runs of one model add their cells up, their speed-ups are averaged
geometrically; several RULER runs of the same prompts add their methods, each method's figures
from the first run that has it), prints one table and draws the figure (docs/RESULTS.md §14).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from plots import fidelity_points, plot_fidelity  # benchmarks/plots.py: the script's folder is on sys.path


def merged_needle(paths: list[Path]) -> dict | None:
    """Several ``eval needle`` runs of one model as one summary: cells add up, speed-ups average."""
    runs = [json.loads(p.read_text())["summary"] for p in paths]
    if not runs:
        return None
    out = {}
    for m in runs[0]:
        have = [r[m] for r in runs if m in r]
        out[m] = {"hits_where_full_hits": sum(s["hits_where_full_hits"] for s in have),
                  "full_hit_cells": sum(s["full_hit_cells"] for s in have),
                  "ttft_ratio_vs_full": math.exp(sum(math.log(s["ttft_ratio_vs_full"]) for s in have) / len(have))}
    return {"summary": out}


def merged_ruler(paths: list[Path]) -> dict | None:
    """Several ``eval ruler`` runs of one model on the same prompts (same seed, tasks and
    lengths) as one: each method from the first run that has it."""
    runs = [json.loads(p.read_text()) for p in paths]
    if not runs:
        return None
    keys = {(tuple(r["config"]["tasks"]), tuple(r["config"]["lengths"]), r["config"]["seed"]) for r in runs}
    if len(keys) > 1:
        raise SystemExit(f"--ruler runs differ in tasks, lengths or seed ({sorted(keys)}): their ratios do not compare")
    overall: dict = {}
    for r in runs:
        for m, a in r["overall"].items():
            overall.setdefault(m, a)
    return {"overall": overall}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="the model's name, for the title")
    p.add_argument("--needle", default="", help="comma list of `ragpic eval needle --json` files (one model)")
    p.add_argument("--musique", type=Path, help="`ragpic eval --json` file")
    p.add_argument("--ruler", default="", help="comma list of `ragpic eval ruler --json` files (one model, same prompts)")
    p.add_argument("--out", type=Path, required=True, help="PNG to write")
    args = p.parse_args(argv)
    needle = merged_needle([Path(x) for x in args.needle.split(",") if x])
    load = lambda f: json.loads(f.read_text()) if f else None  # noqa: E731
    ruler = merged_ruler([Path(x) for x in args.ruler.split(",") if x])
    points = fidelity_points(needle, load(args.musique), ruler)
    if not points:
        p.error("give --needle, --musique or --ruler")
    print(f"{args.model}: accuracy ratio to full (speed-up vs full)")
    for name, pts in points.items():
        cells = "  ".join(f"{m} {y:.2f} ({x:.1f}x)" for m, (x, y, _) in pts.items())
        print(f"  {name:<8} {cells}")
    print(f"wrote {plot_fidelity(args.model, points, args.out)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
