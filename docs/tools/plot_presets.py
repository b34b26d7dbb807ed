"""The choosing-a-method pictures: each preset's fidelity against its link speed-up, one per model.

Reads the presets' calibrations under docs/results/ (the runs that made the shipped calibrations)
and writes docs/img/presets_<model>.png. Run from the repository root:

    .venv/bin/python docs/tools/plot_presets.py
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ragpic.core.methods import PRESETS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RUNS = {  # model: (calibration run, title)
    "qwen05b": ("calibration_qwen05b_presets_4k.json", "Qwen2.5-Coder-0.5B, RULER 4k"),
    "qwen15b": ("calibration_qwen15b_presets_4k.json", "Qwen2.5-Coder-1.5B, RULER 4k"),
    "smollm2": ("calibration_smollm2_presets.json", "SmolLM2-135M (embedded), RULER 2k"),
}
FULL_CAN = 0.5  # a task full can do: full scores at least this (what auto is held to)


def points(run: dict) -> list[tuple[str, float, float, float]]:
    """``(preset, speed-up, worst share, mean share capped at 1)`` over the tasks full can do."""
    by_recipe = {p.recipe: name for name, p in PRESETS.items()}
    tasks = [t for t, s in run["full_scores"].items() if s is not None and s >= FULL_CAN]
    out = []
    for r in run["recipes"]:
        name = by_recipe.get(r["method"])
        if name is None:
            continue
        shares = [r["shares"][t] or 0.0 for t in tasks]
        out.append((name, r["speedup"], min(shares), sum(min(s, 1.0) for s in shares) / len(shares)))
    return out


def plot(model: str, run_file: str, title: str, auto: str | None) -> Path:
    run = json.loads((ROOT / "docs" / "results" / run_file).read_text())
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    ax.axhline(97, color="0.6", ls="--", lw=1, label="auto's bar: 97% of full")
    ax.scatter([1], [100], color="black", zorder=3, label="full")
    for name, speed, worst, mean in points(run):
        color = {"fast": "tab:orange", "balanced": "tab:blue", "faithful": "tab:green"}[name]
        label = name + (" (auto)" if name == auto else "")
        ax.scatter([speed], [worst * 100], color=color, zorder=3, s=40, label=label)
        ax.scatter([speed], [mean * 100], facecolors="none", edgecolors=color, zorder=3, s=40)
        ax.plot([speed, speed], [worst * 100, mean * 100], color=color, lw=1)
    ax.legend(loc="lower left", fontsize=8, framealpha=0.9)
    ax.set_xlim(0.5, 11)
    ax.set_ylim(-5, 110)
    ax.set_xlabel("link speed-up against full (time to first token)")
    ax.set_ylabel("share of full's score (%)")
    ax.set_title(f"{title}\nfilled: worst task full can do; hollow: mean over those tasks", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = ROOT / "docs" / "img" / f"presets_{model}.png"
    fig.savefig(out)
    plt.close(fig)
    return out


def main() -> None:
    autos = {"qwen05b": "faithful", "qwen15b": "balanced", "smollm2": "fast"}  # what the shipped calibrations choose
    for model, (run_file, title) in RUNS.items():
        print(plot(model, run_file, title, autos[model]))


if __name__ == "__main__":
    main()
