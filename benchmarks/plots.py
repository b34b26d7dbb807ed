"""The research figures drawn from several runs' JSON: fidelity against link speed-up.

``plot_pareto`` (``benchmarks/pareto.py``, docs/RESULTS.md §9) and ``fidelity_points`` /
``plot_fidelity`` (``benchmarks/fidelity_curves.py``, §14). The figures a user command draws
with ``--plot`` stay in the package (``ragpic/eval/plots.py``). The scripts import this module
as a sibling (``python benchmarks/pareto.py`` puts ``benchmarks/`` on ``sys.path``).

Drawn on ``matplotlib.figure.Figure`` objects: no pyplot, so no global backend choice and
no figure registry in the caller's process.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["fidelity_points", "plot_fidelity", "plot_pareto"]


def plot_pareto(eval_report: dict | None, needle_result: dict | None, path: str | Path) -> Path:
    """Fidelity vs speed-up, one point per method: MuSiQue TF KL (with its 95% interval) and/or
    needle hits where ``full`` hits, against ``full``'s link time / the method's (log x).

    ``eval_report``: ``ragpic eval --json``'s dict; ``needle_result``: ``ragpic eval needle --json``'s.
    """
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure registry

    panels = [p for p in (eval_report, needle_result) if p is not None]
    if not panels:
        raise ValueError("plot_pareto needs an eval report, a needle result, or both")
    fig = Figure(figsize=(6 * len(panels), 4.4))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, data in zip(axes, panels):
        if data is eval_report:
            rows = {m: (a["ttft_ratio_vs_full"], a["tf_kl_vs_full"], a.get("tf_kl_vs_full_ci95"))
                    for m, a in data["methods"].items()}
            ax.set_ylabel("MuSiQue teacher-forced KL vs full (lower is better)")
            ax.set_title(f"QA fidelity, {data['config'].get('questions', '?')} questions", fontsize=10)
        else:
            rows = {m: (s["ttft_ratio_vs_full"], s["hits_where_full_hits"], None)
                    for m, s in data["summary"].items()}
            cells = next(iter(data["summary"].values()))["full_hit_cells"]
            ax.set_ylabel(f"needle hits where full hits (of {cells}, higher is better)")
            ax.set_title("needle in a haystack, 1k-6k tokens", fontsize=10)
        for i, (m, (x, y, ci)) in enumerate(rows.items()):
            err = None if ci is None else [[y - ci[0]], [ci[1] - y]]
            ax.errorbar([x], [y], yerr=err, fmt="o", color=f"C{i}", capsize=3)
            ax.annotate(m, (x, y), textcoords="offset points", xytext=(5, 4 if i % 2 else -10), fontsize=8)
        # the speed bar a method had to reach: a link 10x faster than full (docs/RESULTS.md §9)
        ax.axvline(10, ls="--", color="grey", alpha=0.6, lw=1)
        ax.set_xscale("log")
        ax.set_xlabel("speed-up of the link vs full (median, x)")
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle("ragpic methods: fidelity vs speed (up and right / down and right is better)", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def fidelity_points(needle: dict | None = None, musique: dict | None = None,
                    ruler: dict | None = None) -> dict[str, dict[str, tuple[float, float, list | None]]]:
    """Each evaluation's ``method -> (speed-up vs full, accuracy ratio to full, its 95% CI or None)``.

    The ratios (docs/RESULTS.md §14): needle, hits in the cells ``full`` hits / those cells;
    MuSiQue, the share of questions whose greedy answer equals ``full``'s (normalised); RULER,
    the mean task score / ``full``'s, with its paired bootstrap interval.
    """
    out: dict[str, dict[str, tuple[float, float, list | None]]] = {}
    if needle:
        out["needle"] = {m: (s["ttft_ratio_vs_full"], s["hits_where_full_hits"] / max(1, s["full_hit_cells"]), None)
                         for m, s in needle["summary"].items()}
    if musique:
        out["MuSiQue"] = {m: (a["ttft_ratio_vs_full"], _same_as_full(musique, m), None) for m, a in musique["methods"].items()}
    if ruler:
        out["RULER"] = {m: (a["ttft_ratio_vs_full"], a["score_ratio_vs_full"], a.get("score_ratio_vs_full_ci95"))
                        for m, a in ruler["overall"].items()}
    return out


def _same_as_full(report: dict, method: str) -> float:
    """A ``ragpic eval`` report's answer identity with ``full`` for ``method``; runs made before
    the report carried it get it from their per-question answers, by the same rule."""
    summary = report["methods"][method]
    if "same_as_full" in summary:
        return summary["same_as_full"]
    from ragpic.eval.scoring import exact_match, mean

    return mean([exact_match(q["methods"][method]["answer"], q["methods"]["full"]["answer"])
                 for q in report["questions"]])


def plot_fidelity(model: str, points: dict[str, dict[str, tuple[float, float, list | None]]],
                  path: str | Path) -> Path:
    """One model's figure: accuracy ratio to ``full`` against link speed-up (log x), a marker per
    evaluation, a colour per method (:func:`fidelity_points` gives ``points``)."""
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure registry

    if not points:
        raise ValueError("plot_fidelity needs at least one evaluation's points")
    methods = list(dict.fromkeys(m for pts in points.values() for m in pts))
    fig = Figure(figsize=(7, 4.6))
    ax = fig.subplots()
    for marker, (name, pts) in zip("osD^v", points.items()):
        for m, (x, y, ci) in pts.items():
            err = None if ci is None else [[max(0.0, y - ci[0])], [max(0.0, ci[1] - y)]]
            ax.errorbar([x], [y], yerr=err, fmt=marker, color=f"C{methods.index(m)}", capsize=3, ms=6)
    # the legend: a colour per method, a marker per evaluation (proxies: the points carry neither alone)
    proxies = [ax.plot([], [], "-", lw=5, color=f"C{i}")[0] for i in range(len(methods))]
    proxies += [ax.plot([], [], mk, color="grey")[0] for mk, _ in zip("osD^v", points)]
    ax.legend(proxies, [*methods, *points], fontsize=7, loc="lower left")
    ax.axhline(0.97, ls=":", color="grey", lw=1)  # the fidelity bar (97% of full)
    ax.axvline(10, ls="--", color="grey", alpha=0.6, lw=1)  # the speed bar (10x at 4k)
    ax.set_xscale("log")
    ax.set_ylim(0, 1.08)
    ax.set_xlabel("speed-up of the link vs full (median, x)")
    ax.set_ylabel("accuracy ratio to full")
    ax.set_title(f"{model}: fidelity vs speed (up and right is better)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path
